// Times sandbox.commands.run through the E2B JavaScript SDK for the serve
// benchmark. It connects to the sandbox SANDBOX_ID once, then for each
// line read on stdin runs CMD and prints the round trip in milliseconds
// (or `error MESSAGE`). The SDK is required from E2B_SDK_DIR (the
// node_modules of integration/e2b).
const path = require('node:path')
const readline = require('node:readline')

const { Sandbox } = require(path.join(process.env.E2B_SDK_DIR, 'e2b'))

async function main() {
  const sandbox = await Sandbox.connect(process.env.SANDBOX_ID, { requestTimeoutMs: 60_000 })
  const cmd = process.env.CMD
  const want = process.env.WANT
  console.log('ready')
  const rl = readline.createInterface({ input: process.stdin })
  for await (const _ of rl) {
    const t0 = process.hrtime.bigint()
    try {
      const res = await sandbox.commands.run(cmd, { timeoutMs: 60_000, requestTimeoutMs: 60_000 })
      const ms = Number(process.hrtime.bigint() - t0) / 1e6
      if (res.stdout !== want) {
        console.log(`error stdout ${JSON.stringify(res.stdout)}, want ${JSON.stringify(want)}`)
        continue
      }
      console.log(ms.toFixed(3))
    } catch (err) {
      console.log(`error ${String(err && err.message).replace(/\n/g, ' ')}`)
    }
  }
}

main().catch((err) => {
  console.log(`error ${String(err && err.message).replace(/\n/g, ' ')}`)
  process.exit(1)
})
