#!/usr/bin/env node
// Throughput of the official TypeScript client's IdempotentProducer (@durable-streams/client
// 0.2.7, pinned in package-lock.json) with its default settings (maxBatchBytes 1 MiB, lingerMs 5,
// maxInFlight 5), for bench/sdk.py.
//
// Usage:
//   node ts-producer-bench.mjs --base http://127.0.0.1:4437 --stream NAME [--messages 1000000]
//
// Creates NAME as a JSON stream (untimed), then times: append() of every message, each a JSON
// object of exactly 100 bytes {"i":<n>,"pad":"<letters>"} serialised with JSON.stringify in the
// loop (the client takes pre-serialised JSON), then close() (flush, then EOF). Prints ONE JSON
// line: {"messages", "seconds", "msgPerSec", "batches", "finalOffset", "cpuSeconds", "errors"}.
// Exit status 1 on any producer error.
import { parseArgs } from "node:util"
import { DurableStream, IdempotentProducer } from "@durable-streams/client"

const { values } = parseArgs({
  options: {
    base: { type: `string` },
    stream: { type: `string` },
    messages: { type: `string`, default: `1000000` },
  },
  allowPositionals: false,
})
if (!values.base || !values.stream) {
  console.error(`usage: node ts-producer-bench.mjs --base URL --stream NAME [--messages N]`)
  process.exit(2)
}
const url = `${values.base.replace(/\/+$/, ``)}/v1/stream/${values.stream}`
const total = Number(values.messages)

const PAD = `abcdefghijklmnopqrstuvwxyz`.repeat(8)
const MESSAGE_BYTES = 100

// The same message as bench/load.py's message(i): 100 bytes for i < 10**9.
function message(i) {
  const head = `{"i":${i},"pad":"`.length
  const start = i % 26
  return { i, pad: PAD.slice(start, start + MESSAGE_BYTES - head - 2) }
}

const handle = await DurableStream.create({ url, contentType: `application/json`, warnOnHttp: false })
const errors = []
const producer = new IdempotentProducer(handle, `ts-bench`, {
  onError: (err) => errors.push(String(err)),
})

const cpu0 = process.cpuUsage()
const t0 = performance.now()
for (let i = 0; i < total; i++) producer.append(JSON.stringify(message(i)))
const { finalOffset } = await producer.close()
const seconds = (performance.now() - t0) / 1000
const cpu = process.cpuUsage(cpu0)

process.stdout.write(
  JSON.stringify({
    messages: total,
    seconds,
    msgPerSec: total / seconds,
    batches: producer.nextSeq - 1,
    finalOffset,
    cpuSeconds: (cpu.user + cpu.system) / 1e6,
    errors,
  }) + `\n`
)
process.exit(errors.length ? 1 : 0)
