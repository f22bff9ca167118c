// Shared helpers of the end-to-end scripts that drive `hutch serve` through
// the E2B JavaScript SDK.
//
// A script is a list of named checks. Each check prints one line
//   CHECK {"name": ..., "ok": true|false, "ms": ..., "error": ..., "notes": [...]}
// as it finishes, and the script ends with a line `DONE {"failed": N}`.
// The Go test reads these lines and reports each check as a subtest, so a
// failure names the flow a user would recognise. Every check is bounded in
// time, and so is every wait inside one.

import http from 'node:http'
import { createHash } from 'node:crypto'
import assert from 'node:assert/strict'

export { assert }

// Against a server over TLS, the key and the domain are all a user sets
// (the SDK's default https:// URLs); on plain HTTP the scripts also get
// E2B_API_URL, E2B_SANDBOX_URL and the server's port.
// A script that drives no server (HUTCH_NO_SERVE=1) needs neither.
const required = process.env.HUTCH_NO_SERVE === '1' ? [] : ['E2B_API_KEY', 'E2B_DOMAIN']
for (const name of required) {
  if (!process.env[name]) {
    console.error(`${name} is not set: run this script through the Go test (go test ./integration -run Serve)`)
    process.exit(2)
  }
}

/** The port `hutch serve` listens on, on 127.0.0.1 (plain HTTP only). */
export const servePort = Number(process.env.HUTCH_SERVE_PORT)

/** A tag unique to this run, put in metadata so listings can be filtered. */
export const runID = `${process.pid}-${Date.now()}`

let failed = 0
let skipRest = ''

/**
 * Runs one named check with a time limit. A check that throws (or times
 * out) is reported as failed with its message; later checks still run
 * unless `opts.fatal` is set, in which case they are reported as not run.
 * `fn` receives a `note(text)` function to report facts that are not
 * assertions (what the server did, for the report).
 */
export async function check(name, fn, opts = {}) {
  const limitMs = opts.timeoutMs ?? 60_000
  const notes = []
  const started = Date.now()
  if (skipRest) {
    emit({ name, ok: false, ms: 0, error: `not run: ${skipRest}`, notes })
    failed++
    return undefined
  }
  let timer
  try {
    const value = await Promise.race([
      fn((text) => notes.push(String(text))),
      new Promise((_, reject) => {
        timer = setTimeout(() => reject(new Error(`check did not finish within ${limitMs} ms`)), limitMs)
      }),
    ])
    emit({ name, ok: true, ms: Date.now() - started, notes })
    return value
  } catch (err) {
    failed++
    emit({ name, ok: false, ms: Date.now() - started, error: describe(err), notes })
    if (opts.fatal) skipRest = `"${name}" failed`
    return undefined
  } finally {
    clearTimeout(timer)
  }
}

/** Ends the script: prints the summary line and sets the exit code. */
export function done() {
  console.log(`DONE ${JSON.stringify({ failed })}`)
  process.exitCode = failed ? 1 : 0
}

function emit(result) {
  console.log(`CHECK ${JSON.stringify(result)}`)
}

/** An error as a user would read it: its class, message and first frames. */
export function describe(err) {
  if (!(err instanceof Error)) return String(err)
  const frames = (err.stack ?? '').split('\n').slice(1, 4).map((l) => l.trim()).join(' | ')
  const cause = err.cause ? ` (cause: ${describe(err.cause)})` : ''
  return `${err.constructor.name}: ${err.message}${cause}${frames ? ` [${frames}]` : ''}`
}

/** Resolves after ms milliseconds. */
export function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms))
}

/**
 * Polls cond every intervalMs until it returns a truthy value, for at most
 * timeoutMs; returns that value or throws naming what was awaited.
 */
export async function waitFor(what, cond, { timeoutMs = 10_000, intervalMs = 100 } = {}) {
  const deadline = Date.now() + timeoutMs
  let last
  for (let i = 0; Date.now() < deadline && i < 10_000; i++) {
    try {
      const v = await cond()
      if (v) return v
      last = undefined
    } catch (err) {
      last = err
    }
    await sleep(intervalMs)
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? `; last error: ${describe(last)}` : ''}`)
}

/**
 * Expects promise to reject; returns the error. Fails when it resolves.
 */
export async function rejects(promise, what) {
  let value
  try {
    value = await promise
  } catch (err) {
    return err
  }
  throw new assert.AssertionError({ message: `${what}: expected an error, got ${JSON.stringify(value)}` })
}

/** Asserts err is an instance of cls, with a message that says what it was. */
export function assertErrorClass(err, cls, what) {
  assert.ok(err instanceof cls, `${what}: expected ${cls.name}, got ${describe(err)}`)
}

/**
 * Sends one HTTP request to `hutch serve` on loopback with the given Host
 * header (as a browser would for sandbox.getHost(port)), and returns
 * {status, body}. Bounded by timeoutMs.
 */
export function requestByHost(host, path = '/', { timeoutMs = 5_000, method = 'GET' } = {}) {
  if (!servePort) throw new Error('requestByHost needs HUTCH_SERVE_PORT (a server on plain HTTP)')
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: '127.0.0.1', port: servePort, path, method, headers: { Host: host }, timeout: timeoutMs },
      (res) => {
        const chunks = []
        res.on('data', (c) => chunks.push(c))
        res.on('end', () => resolve({ status: res.statusCode, body: Buffer.concat(chunks).toString('utf8') }))
        res.on('error', reject)
      },
    )
    req.on('timeout', () => req.destroy(new Error(`HTTP ${method} ${host}${path} timed out after ${timeoutMs} ms`)))
    req.on('error', reject)
    req.end()
  })
}

/** sha256 of a buffer, hex. */
export function sha256(buf) {
  return createHash('sha256').update(buf).digest('hex')
}

/** sha256 of a web ReadableStream, hex, and its length. */
export async function sha256Stream(stream) {
  const h = createHash('sha256')
  let size = 0
  const reader = stream.getReader()
  for (;;) {
    const { done: end, value } = await reader.read()
    if (end) break
    size += value.byteLength
    h.update(value)
  }
  return { hash: h.digest('hex'), size }
}

/**
 * A sandbox ID of the same shape as id that names no sandbox: each digit
 * and letter is moved by one within its class.
 */
export function unknownIDLike(id) {
  return id.replace(/[0-9a-zA-Z]/g, (c) => {
    if (c >= '0' && c <= '9') return String.fromCharCode(((c.charCodeAt(0) - 48 + 1) % 10) + 48)
    const base = c >= 'a' ? 97 : 65
    return String.fromCharCode(((c.charCodeAt(0) - base + 1) % 26) + base)
  })
}

/** Kills every sandbox in list, ignoring errors: cleanup at the end of a script. */
export async function killAll(sandboxes) {
  await Promise.all(
    sandboxes.filter(Boolean).map(async (s) => {
      try {
        await s.kill({ requestTimeoutMs: 30_000 })
      } catch {
        // reported by the Go test's leftover check
      }
    }),
  )
}
