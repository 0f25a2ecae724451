"""streamasr: streaming English ASR and simultaneous English->German speech translation."""

__version__ = "0.1.0"
