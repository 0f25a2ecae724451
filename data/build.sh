#!/usr/bin/env bash
# Rebuild the corpora and tuning sets of data/README.md on a new machine, one command each.
#
#   bash data/build.sh                  # everything the shipped recipe reads, in the order below
#   bash data/build.sh eval tune        # only these (names: bash data/build.sh --list)
#   JOBS=1 bash data/build.sh kdrawn    # one core, beside training
#   bash data/build.sh --print train    # the commands, one a line, run nothing
#
# Every build resumes: audio that exists is kept, and a split's manifest is written when its build
# ends, so a killed run is started again with the same command. Each name logs to
# runs/build/NAME.log; the script stops at the first build that fails.
set -euo pipefail
cd "$(dirname "$0")/.."

M30K=${M30K:-../shared/data/multi30k}
JOBS=${JOBS:-2}
STREAMASR=${STREAMASR:-$(command -v streamasr || echo .venv/bin/streamasr)}
BUILD=("$STREAMASR" data build --multi30k "$M30K" --jobs "$JOBS")
VOCODE=("$STREAMASR" data vocode --jobs "$JOBS")

KOKORO5=(jf_alpha jf_gongitsune jf_nezumi jf_tebukuro jm_kumo)
DRAWN_ACCENTS=(en-us en-gb en-gb-scotland en-gb-x-gbclan en-gb-x-rp)

voices() {  # SPEAKERS... -- ACCENTS...: every speaker in every accent, kokoro:S@A,...
    local speakers=() accent speaker out=""
    while [[ $1 != -- ]]; do speakers+=("$1"); shift; done
    shift
    for accent in "$@"; do
        for speaker in "${speakers[@]}"; do out+="kokoro:$speaker${accent:+@$accent},"; done
    done
    echo "${out%,}"
}

drawn() {  # drawn speakers FIRST..LAST, speaker i reading the training accent i mod 5
    local i out=""
    for i in $(seq "$1" "$2"); do out+="kokoro:drawn-$i@${DRAWN_ACCENTS[$((i % 5))]},"; done
    echo "${out%,}"
}

# name | what it makes (data/README.md has each one's voices, sizes and build times)
build_eval() { "${BUILD[@]}" --out data/corpus --splits val,test_2016_flickr; }
build_tune() { "${BUILD[@]}" --out data/tune --splits val --limit 300 --pool-voices --seed 7; }
build_tune_kaccent() {
    "${BUILD[@]}" --out data/tune-kaccent --splits val --pool-voices --limit 200 --seed 25 \
        --voices "$(voices "${KOKORO5[@]}" -- en-029)"
}
build_tune_kdrawn() {
    # ten drawn speakers no training corpus has, reading American English
    "${BUILD[@]}" --out data/tune-kdrawn --splits val --pool-voices --limit 200 --seed 28 \
        --voices "$(voices $(seq -f 'drawn-%g' 1001 1010) -- '')"
}
build_tune_kdrawn2() {
    # twenty more drawn speakers on the next 400 val sentences (session 59: rule 31's drawn check
    # reads the pool of both sets, 600 utterances, thirty speakers)
    "${BUILD[@]}" --out data/tune-kdrawn2 --splits val --pool-voices --start 200 --limit 400 \
        --seed 59 --voices "$(voices $(seq -f 'drawn-%g' 1011 1030) -- '')"
}
build_tune_voc() {
    "${VOCODE[@]}" --seed 26 data/tune/val.jsonl --out data/tune-voc --split val --held-out
    "${VOCODE[@]}" --seed 26 data/tune-kaccent/val.jsonl --out data/tune-kaccent-voc --split val \
        --held-out
}
build_tune_mlsa() {
    local v=("${VOCODE[@]}" --seed 26 --vocoder mlsa --held-out --split val)
    "${v[@]}" data/tune/val.jsonl --out data/tune-mlsa
    "${v[@]}" data/tune-kaccent/val.jsonl --out data/tune-kaccent-mlsa
}
build_train() { "${BUILD[@]}" --out data/corpus --splits train; }
build_joe() {
    "${BUILD[@]}" --out data/corpus-joe --splits train --voices piper:joe --limit 8000 --seed 1
}
build_kokoro() {
    "${BUILD[@]}" --out data/corpus-kokoro --splits train --start 8000 --limit 1800 --seed 4 \
        --voices "$(voices "${KOKORO5[@]}" -- '')"
}
build_kaccent() {
    "${BUILD[@]}" --out data/corpus-kaccent --splits train \
        --voices "$(voices "${KOKORO5[@]}" -- en-gb en-gb-scotland en-gb-x-gbclan en-gb-x-rp)" \
        --start 15000 --limit 900 --seed 25
}
build_world() {
    "${VOCODE[@]}" --seed 26 data/corpus/train.jsonl:1500 data/corpus-joe/train.jsonl:1500 \
        data/corpus-kokoro/train.jsonl:1000 data/corpus-kaccent/train.jsonl:800 \
        --out data/corpus-world
}
build_kdrawn() {
    "${BUILD[@]}" --out data/corpus-kdrawn --splits train --voices "$(drawn 1 40)" \
        --start 16000 --limit 1800 --seed 28
}
build_kdrawn2() {
    "${BUILD[@]}" --out data/corpus-kdrawn2 --splits train --voices "$(drawn 41 120)" \
        --start 17800 --limit 2400 --seed 29
}
build_kdrawn3() {
    "${BUILD[@]}" --out data/corpus-kdrawn3 --splits train --voices "$(drawn 121 200)" \
        --start 20200 --limit 2400 --seed 30
}
build_kaccent2() {
    # drawn speakers 201-280, speaker i in training accent i mod 5 and synthetic accent i
    local i voices=""
    for i in $(seq 201 280); do voices+="kokoro:drawn-$i@${DRAWN_ACCENTS[$((i % 5))]}~$i,"; done
    "${BUILD[@]}" --out data/corpus-kaccent2 --splits train --voices "${voices%,}" \
        --start 25000 --limit 1200 --seed 58
}
build_gnuspeech() {
    # GnuSpeech's articulatory voices, the grown-ups and the children (needs `make gnuspeech`)
    "${BUILD[@]}" --out data/corpus-gnuspeech --splits train --start 22600 --limit 2400 --seed 55 \
        --voices gnuspeech:male,gnuspeech:female,gnuspeech:large_child,gnuspeech:small_child
}

# The evaluation and tuning sets first (minutes), then the training corpora (hours; Kokoro's are
# the slow ones), gnuspeech last (it needs `make gnuspeech`; the shipped weights read it since
# session 56, and kaccent2 since session 60). tune-mlsa is left out: no rule since session 26
# reads it.
ALL=(eval tune tune-kaccent tune-kdrawn tune-kdrawn2 tune-voc train joe kaccent kokoro world kdrawn
    kdrawn2 kdrawn3 kaccent2 gnuspeech)

case ${1:-} in
    --list) printf '%s\n' "${ALL[@]}" tune-mlsa; exit 0 ;;
    --print) shift; BUILD=(echo "${BUILD[@]}"); VOCODE=(echo "${VOCODE[@]}"); print=1 ;;
esac
[[ $# -gt 0 ]] || set -- "${ALL[@]}"
for name; do
    if ! declare -F "build_${name//-/_}" >/dev/null; then
        echo "data/build.sh: unknown name '$name' (bash data/build.sh --list)" >&2
        exit 2
    fi
done
if [[ -n ${print:-} ]]; then
    for name; do "build_${name//-/_}"; done
    exit 0
fi
mkdir -p runs/build
for name; do
    start=$(date +%s)
    echo "$(date -u +%H:%M:%S) $name ..."
    "build_${name//-/_}" >"runs/build/$name.log" 2>&1 || {
        echo "data/build.sh: $name failed; its log: runs/build/$name.log" >&2
        exit 1
    }
    summary=$(tr '\r' '\n' <"runs/build/$name.log" | grep -E 'utterances: [0-9]+' | tail -n 1 || true)
    echo "$(date -u +%H:%M:%S) $name done in $(($(date +%s) - start)) s: $summary"
done
