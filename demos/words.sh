#!/usr/bin/env bash
# Your own words (README, Use): twelve sentences holding eight terms the shipped lexicon lacks
# (demos/words/sentences.en, terms.txt), read by two Kokoro speakers no run heard and a training
# voice; the shipped search, `lm --text terms.txt`, and `--words terms.txt` at several bonuses,
# each at 320 ms, k = 3: terms written of 39 and the WER. Then the false alarms: the first 100
# utterances of data/tune-kdrawn (`bash data/build.sh tune-kdrawn`) with each bonus, and with
# three common words favoured (common.txt). About 13 minutes (one thread an evaluation).
#
#   bash demos/words.sh                 # BONUSES="0 1 2 4 6 8" WORK=runs/words
set -euo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-runs/words}
BONUSES=${BONUSES:-0 1 2 4 6 8}
S=.venv/bin/streamasr
export OMP_NUM_THREADS=1
mkdir -p "$WORK/text"
cp demos/words/sentences.en "$WORK/text/train.en"
: > "$WORK/all.jsonl"
for voice in kokoro:drawn-1001 kokoro:drawn-1006@en-gb flite:rms; do
    out="$WORK/c-${voice//[:@]/_}"
    $S data build --multi30k "$WORK/text" --out "$out" --splits train --voices "$voice" \
        --jobs 1 --seed 36 > /dev/null
    python3 -c "import json, sys
for line in open(sys.argv[1] + '/train.jsonl'):  # the audio relative to all.jsonl
    r = json.loads(line); r['audio'] = sys.argv[2] + '/' + r['audio']; r['id'] = sys.argv[2] + r['id']
    print(json.dumps(r))" "$out" "$(basename "$out")" >> "$WORK/all.jsonl"
done
# `lm --text`: a copy of the shipped folder with its LM built again, the terms beside the text
mkdir -p "$WORK/model"
cp models/base/{config.json,en.model,de.model,transcript.model,feature_stats.safetensors,model.safetensors} "$WORK/model/"
$S lm --multi30k ../shared/data/multi30k --text demos/words/terms.txt --model "$WORK/model" > /dev/null
for b in $BONUSES; do sed "s/\$/ $b/" demos/words/terms.txt > "$WORK/terms$b.txt"; done
for b in $BONUSES; do sed "s/\$/ $b/" demos/words/common.txt > "$WORK/common$b.txt"; done
ev() { $S eval "$1" --wait-k 3 --out "$WORK/$2" "${@:3}" > "$WORK/$2.log" 2>&1; }
ev "$WORK/all.jsonl" shipped
ev "$WORK/all.jsonl" lm-text --model "$WORK/model"
for b in $BONUSES; do ev "$WORK/all.jsonl" words$b --words "$WORK/terms$b.txt"; done
if [[ -f data/tune-kdrawn/val.jsonl ]]; then
    ev data/tune-kdrawn/val.jsonl fa-none --limit 100
    for b in $BONUSES; do
        ev data/tune-kdrawn/val.jsonl fa-words$b --limit 100 --words "$WORK/terms$b.txt"
        ev data/tune-kdrawn/val.jsonl fa-common$b --limit 100 --words "$WORK/common$b.txt"
    done
fi
.venv/bin/python - "$WORK" <<'PY'
import json, sys
from pathlib import Path
from streamasr.text import normalize_transcript
work = Path(sys.argv[1])
lists = {name: Path(f"demos/words/{name}.txt").read_text().split() for name in ("terms", "common")}
for folder in sorted(p for p in work.iterdir() if (p / "summary.json").is_file()):
    words = lists["common" if "common" in folder.name else "terms"]
    found = total = written = 0  # reference words of the list the transcript has; list words
    for line in open(folder / "instances.jsonl"):
        r = json.loads(line)
        ref, hyp = normalize_transcript(r["text_ref"]).split(), r["transcript"].split()
        total += sum(w in ref for w in words)
        found += sum(w in ref and w in hyp for w in words)
        written += sum(w in words for w in hyp)
    run = json.load(open(folder / "summary.json"))["runs"][0]
    print(f"{folder.name:14s} WER {run['wer']:5.2f} % (full context {run['wer_full_context']:5.2f} %)"
          f"  list words in the references written {found} of {total}, list words written {written}")
PY
