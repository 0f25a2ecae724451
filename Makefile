# Two commands do everything on a fresh Debian machine: `make demo` and `make test`.
# Both are idempotent: stamps under .venv/ make a second run start within seconds.
VENV := .venv
PY := $(VENV)/bin/python
APT_PACKAGES := espeak-ng flite festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts \
	sox libsndfile1 libportaudio2 pulseaudio pulseaudio-utils libasound2-plugins
# torch is pinned first so that pip never pulls a multi-GB CUDA build through a version range.
TORCH := torch==2.14.1 torchaudio==2.11.1

.PHONY: demo test setup system lint clean-venv

demo: setup
	$(PY) -m streamasr.demo

test: setup
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check streamasr tests demos
	$(VENV)/bin/ruff format --check streamasr tests demos

setup: system $(VENV)/.installed

system:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		echo "installing system packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH)
	$(PY) -m pip install -q -e '.[test,tts,lm]'
	touch $@

clean-venv:
	rm -rf $(VENV)
