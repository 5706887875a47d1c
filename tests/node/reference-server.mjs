#!/usr/bin/env node
// Start the Durable Streams reference server (@durable-streams/server 0.3.7)
// with its FILE-BACKED store (FileBackedStreamStore: LMDB metadata +
// append-only log files), bound to 127.0.0.1.
//
// Usage:
//   node reference-server.mjs [--port N] [--data-dir DIR] [--host H]
//                             [--long-poll-timeout MS] [--no-compression] [--memory]
// Env equivalents (flags win):
//   REF_PORT (or PORT), REF_DATA_DIR, REF_HOST, REF_LONG_POLL_TIMEOUT_MS,
//   REF_COMPRESSION=0, REF_MEMORY=1
//
// Defaults: port 4437, data dir ./ref-data (relative to cwd), host 127.0.0.1,
// long-poll timeout 30000 ms (the reference default), compression on (the
// reference default). --memory uses the in-memory StreamStore instead.
//
// NOTE for conformance runs: pass --long-poll-timeout 500 (upstream's own
// conformance setups use 500 ms). Two offset=now long-poll tests wait for the
// server's 204 timeout inside vitest's default 5 s test timeout, so with the
// 30 s default they fail with "Test timed out in 5000ms".
//
// Prints exactly one ready line to stdout once listening:
//   READY http://127.0.0.1:<port> data-dir=<abs dir|memory> long-poll-timeout-ms=<n>
// Stops cleanly on SIGINT/SIGTERM (closes the LMDB store).
import { mkdirSync } from "node:fs"
import { resolve } from "node:path"
import { parseArgs } from "node:util"
import { DurableStreamTestServer } from "@durable-streams/server"

const { values } = parseArgs({
  options: {
    port: { type: `string` },
    host: { type: `string` },
    "data-dir": { type: `string` },
    "long-poll-timeout": { type: `string` },
    "no-compression": { type: `boolean` },
    memory: { type: `boolean` },
  },
  allowPositionals: false,
})

const env = process.env
const port = Number(values.port ?? env.REF_PORT ?? env.PORT ?? 4437)
const host = values.host ?? env.REF_HOST ?? `127.0.0.1`
const memory = values.memory ?? env.REF_MEMORY === `1`
const dataDir = memory
  ? undefined
  : resolve(values[`data-dir`] ?? env.REF_DATA_DIR ?? `ref-data`)
const longPollTimeout = Number(
  values[`long-poll-timeout`] ?? env.REF_LONG_POLL_TIMEOUT_MS ?? 30_000
)
const compression = values[`no-compression`]
  ? false
  : env.REF_COMPRESSION !== `0`

if (!Number.isInteger(port) || port < 0 || port > 65535) {
  console.error(`invalid port: ${values.port ?? env.REF_PORT ?? env.PORT}`)
  process.exit(2)
}
if (!Number.isFinite(longPollTimeout) || longPollTimeout <= 0) {
  console.error(`invalid long-poll timeout: ${longPollTimeout}`)
  process.exit(2)
}
if (dataDir) mkdirSync(dataDir, { recursive: true })

const server = new DurableStreamTestServer({
  port,
  host,
  dataDir,
  longPollTimeout,
  compression,
})

const url = await server.start()
console.log(
  `READY ${url} data-dir=${dataDir ?? `memory`} long-poll-timeout-ms=${longPollTimeout} compression=${compression}`
)

let stopping = false
const shutdown = async (signal) => {
  if (stopping) return
  stopping = true
  // stop() waits for in-flight requests (e.g. open SSE/long-poll or keep-alive
  // sockets held by a client); after a grace period drop them, and give up
  // entirely after 10 s.
  const grace = setTimeout(() => {
    server[`server`]?.closeAllConnections?.()
  }, 1_000)
  const hard = setTimeout(() => {
    console.error(`forced exit: stop() did not finish within 10 s`)
    process.exit(1)
  }, 10_000)
  grace.unref()
  hard.unref()
  try {
    await server.stop()
  } catch (err) {
    console.error(`error during stop (${signal}):`, err)
    process.exit(1)
  }
  process.exit(0)
}
process.on(`SIGINT`, () => shutdown(`SIGINT`))
process.on(`SIGTERM`, () => shutdown(`SIGTERM`))
