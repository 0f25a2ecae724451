#!/usr/bin/env bash
# Training speed: run 30's flags (README Development) for a few steps on 400 training utterances
# of a corpus, from a fresh model of the shipped shape, on a torch device; prints the audio
# seconds trained per second of wall time, from the start (the first step's warm-up included)
# and after the first step.
#
#   bash demos/train_speed.sh                            # cpu, 20 steps, 2 threads
#   DEVICE=cuda STEPS=60 bash demos/train_speed.sh       # a GPU
#   DEVICE=cuda BATCH_FRAMES=24000 THREADS=8 STEPS=30 bash demos/train_speed.sh
#   PRECISION=bf16 bash demos/train_speed.sh             # the losses under bfloat16 autocast
#
# The utterances (400 drawn from CORPUS's train split with seed 0, its first 60 val ones) are
# copied into $WORK/corpus (27 MB for data/corpus), so that folder can travel on its own; a
# second run reuses it and the feature cache made by the first run of each WORK.
set -euo pipefail
cd "$(dirname "$0")/.."
CORPUS=${CORPUS:-data/corpus}
WORK=${WORK:-runs/train-speed}
DEVICE=${DEVICE:-cpu}
STEPS=${STEPS:-20}
BATCH_FRAMES=${BATCH_FRAMES:-6000}
THREADS=${THREADS:-2}
PRECISION=${PRECISION:-fp32}
PY=${PY:-$(test -x .venv/bin/python && echo .venv/bin/python || echo python3)}

if [[ ! -f $WORK/corpus/val.jsonl ]]; then
    "$PY" - "$CORPUS" "$WORK/corpus" <<'PYTHON'
import json, random, shutil, sys
from pathlib import Path

source, out = Path(sys.argv[1]), Path(sys.argv[2])
(out / "wav").mkdir(parents=True, exist_ok=True)
for split, count in (("train", 400), ("val", 60)):
    rows = [json.loads(line) for line in (source / f"{split}.jsonl").read_text().splitlines()]
    rows = random.Random(0).sample(rows, count) if split == "train" else rows[:count]
    for row in rows:
        copy = out / "wav" / Path(row["audio"]).name
        shutil.copyfile(source / row["audio"], copy)
        row["audio"] = f"wav/{copy.name}"
    lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    (out / f"{split}.jsonl").write_text(lines)
PYTHON
fi
run=$WORK/$DEVICE-$BATCH_FRAMES-$THREADS-$PRECISION
rm -f "$run/checkpoint.pt" "$run/train_log.jsonl"  # the feature cache stays
"$PY" -m streamasr.cli train --corpus "$WORK/corpus" --work "$run" --steps 1200 --stop-at "$STEPS" \
    --device "$DEVICE" --threads "$THREADS" --precision "$PRECISION" --batch-frames "$BATCH_FRAMES" \
    --seed 31 --augment-from 0 --speed-range 0.8,1.25 --warp-range 0.8,1.2 --lead-silence-ms 2000 \
    --eq-db 5 --reverb-prob 0.3 --right-context-frames 4 --val-every 100000 --val-utterances 60
"$PY" - "$run/train_log.jsonl" "$DEVICE" "$BATCH_FRAMES" "$THREADS" "$PRECISION" <<'PYTHON'
import json, sys

log, device, frames, threads, precision = sys.argv[1:]
records = [json.loads(line) for line in open(log)]
first, last = records[0], records[-1]
steady = ""
if last["time"] > first["time"]:
    rate = (last["audio_s"] - first["audio_s"]) / (last["time"] - first["time"])
    steps = (len(records) - 1) / (last["time"] - first["time"])
    steady = f"; after the first step {rate:.1f} audio s per s, {steps:.2f} steps/s"
print(
    f"device {device}, batch_frames {frames}, threads {threads}, {precision}: {len(records)} steps, "
    f"{last['audio_s_per_s']} audio s trained per s from the start{steady}"
)
PYTHON
