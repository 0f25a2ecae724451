// GnuSpeech (articulatory synthesis: a tube model of the vocal tract driven by rules) reading one
// sentence, through the WebAssembly port published on npm as @echogarden/gnuspeech-wasm.
//   node gnuspeech.mjs MODULES VOICE TEXT_FILE OUT_WAV
// MODULES is the folder `npm install --prefix` put the package under (`make gnuspeech`), VOICE one
// of male, female, large_child, small_child, baby; the WAV is 44.1 kHz mono.
import { readFileSync, writeFileSync } from 'node:fs'
import { createRequire } from 'node:module'
import { pathToFileURL } from 'node:url'

const [modules, voice, textFile, outFile] = process.argv.slice(2)
const entry = createRequire(`${modules}/`).resolve('@echogarden/gnuspeech-wasm')
const { synthesize } = await import(pathToFileURL(entry).href)
const text = readFileSync(textFile, 'utf8').trim()
const { audioData } = await synthesize(text, { voice })
writeFileSync(outFile, audioData)
