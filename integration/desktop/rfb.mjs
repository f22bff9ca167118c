// A VNC (RFB 3.8) client handshake over noVNC's WebSocket, for the
// desktop tests: it proves that the URL @e2b/desktop's stream gives
// reaches the sandbox's VNC server through hutch serve's port routing,
// what security the server asks for, whether a password opens it, and
// the size of the framebuffer it serves.
//
// VNC authentication encrypts the server's challenge with DES, which
// Node's OpenSSL 3 keeps in its legacy provider: the test runs node with
// --openssl-legacy-provider.

import { createCipheriv } from 'node:crypto'
import WebSocket from 'ws'

class Reader {
  constructor(ws) {
    this.buf = Buffer.alloc(0)
    this.waiters = []
    this.closed = null
    ws.on('message', (data) => {
      this.buf = Buffer.concat([this.buf, Buffer.from(data)])
      this.wake()
    })
    ws.on('close', (code, reason) => {
      this.closed = `closed (${code} ${reason})`
      this.wake()
    })
    ws.on('error', (err) => {
      this.closed = `error: ${err.message}`
      this.wake()
    })
  }
  wake() {
    for (const w of this.waiters.splice(0)) w()
  }
  async read(n) {
    while (this.buf.length < n) {
      if (this.closed) throw new Error(`VNC connection ${this.closed} after ${this.buf.length} of ${n} bytes`)
      await new Promise((resolve) => this.waiters.push(resolve))
    }
    const out = this.buf.subarray(0, n)
    this.buf = this.buf.subarray(n)
    return out
  }
}

// VNC's DES key: the password's first 8 bytes, each bit-reversed.
function vncKey(password) {
  const key = Buffer.alloc(8)
  Buffer.from(password, 'latin1').copy(key, 0, 0, 8)
  for (let i = 0; i < 8; i++) {
    let b = key[i], r = 0
    for (let j = 0; j < 8; j++) r |= ((b >> j) & 1) << (7 - j)
    key[i] = r
  }
  return key
}

/**
 * Connects to the noVNC URL's WebSocket (wss://HOST/websockify) and runs
 * the RFB handshake. Returns { version, types, result, width, height }:
 * result is 'ok', or the server's reason for refusing. With no password
 * a server that asks for VNC authentication is sent a wrong answer.
 */
export async function vncHandshake(pageUrl, { password, timeoutMs = 20_000 } = {}) {
  const u = new URL(pageUrl)
  const wsUrl = `${u.protocol === 'https:' ? 'wss' : 'ws'}://${u.host}/websockify`
  const ws = new WebSocket(wsUrl, ['binary'])
  const timer = setTimeout(() => ws.terminate(), timeoutMs)
  try {
    await new Promise((resolve, reject) => {
      ws.once('open', resolve)
      ws.once('error', reject)
      ws.once('unexpected-response', (_req, res) => reject(new Error(`${wsUrl}: HTTP ${res.statusCode} instead of a WebSocket`)))
    })
    const r = new Reader(ws)
    const version = (await r.read(12)).toString('latin1')
    if (!version.startsWith('RFB ')) throw new Error(`not an RFB server: ${JSON.stringify(version)}`)
    ws.send(Buffer.from('RFB 003.008\n', 'latin1'))
    const n = (await r.read(1))[0]
    if (n === 0) {
      const len = (await r.read(4)).readUInt32BE(0)
      throw new Error(`server refused: ${(await r.read(len)).toString()}`)
    }
    const types = [...(await r.read(n))]
    let result
    if (types.includes(1) && password === undefined) {
      ws.send(Buffer.from([1]))
    } else if (types.includes(2)) {
      ws.send(Buffer.from([2]))
      const challenge = await r.read(16)
      const des = createCipheriv('des-ecb', vncKey(password ?? 'not-the-password'), null)
      des.setAutoPadding(false)
      ws.send(Buffer.concat([des.update(challenge), des.final()]))
    } else {
      throw new Error(`no security type this client knows among ${types}`)
    }
    const status = (await r.read(4)).readUInt32BE(0)
    if (status !== 0) {
      const len = (await r.read(4)).readUInt32BE(0)
      result = `refused: ${(await r.read(len)).toString()}`
      return { version: version.trim(), types, result }
    }
    result = 'ok'
    ws.send(Buffer.from([1])) // ClientInit: shared
    const init = await r.read(24)
    return { version: version.trim(), types, result, width: init.readUInt16BE(0), height: init.readUInt16BE(2) }
  } finally {
    clearTimeout(timer)
    ws.terminate()
  }
}
