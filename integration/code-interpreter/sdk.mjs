// E2B's code-interpreter SDK (@e2b/code-interpreter, unchanged) against
// `hutch serve` over TLS, set up as against E2B's cloud: only
// E2B_API_KEY and E2B_DOMAIN (the Go test runs it in a network namespace
// whose resolver answers DOMAIN's names with the server). Sandbox.create()
// names no template: the SDK's default, code-interpreter-v1.
// HUTCH_OTHER_KEY is another tenant's key.

import { Sandbox, NotFoundError, TimeoutError } from '@e2b/code-interpreter'
import { assert, check, done, runID } from '../e2b/lib.mjs'

const domain = process.env.E2B_DOMAIN
const created = []

const sandbox = await check(
  'Sandbox.create() with no template name',
  async (note) => {
    const sb = await Sandbox.create({ metadata: { run: runID }, timeoutMs: 900_000 })
    created.push(sb)
    note(`sandbox ${sb.sandboxId}, code interpreter at ${sb.jupyterUrl}`)
    assert.equal(sb.jupyterUrl, `https://49999-${sb.sandboxId}.${domain}`)
    const info = await sb.getInfo()
    assert.ok([info.templateId, info.name].includes('code-interpreter-v1'), `template ${info.templateId} (${info.name})`)
    return sb
  },
  { fatal: true, timeoutMs: 300_000 },
)

await check('runCode keeps state across calls', async (note) => {
  const t0 = Date.now()
  const first = await sandbox.runCode('x = 41\nx')
  note(`the first runCode answered in ${Date.now() - t0} ms`)
  assert.equal(first.text, '41')
  const r = await sandbox.runCode('x + 1')
  assert.equal(r.text, '42')
  assert.equal(r.error, undefined)
  assert.ok(r.executionCount >= 2, `executionCount ${r.executionCount}`)
})

await check('onStdout, onStderr, onResult and onError in order', async () => {
  const seen = []
  const r = await sandbox.runCode(
    [
      'import sys',
      'from IPython.display import display',
      'print("out one"); sys.stdout.flush()',
      'print("err one", file=sys.stderr); sys.stderr.flush()',
      'display(7)',
      'raise ValueError("boom")',
    ].join('\n'),
    {
      onStdout: (m) => seen.push(['stdout', m.line]),
      onStderr: (m) => seen.push(['stderr', m.line]),
      onResult: (res) => seen.push(['result', res.text]),
      onError: (e) => seen.push(['error', e.name]),
    },
  )
  assert.deepEqual(seen, [
    ['stdout', 'out one\n'],
    ['stderr', 'err one\n'],
    ['result', '7'],
    ['error', 'ValueError'],
  ])
  assert.deepEqual(r.logs, { stdout: ['out one\n'], stderr: ['err one\n'] })
  assert.equal(r.error.value, 'boom')
})

await check('a matplotlib line plot returns png and a line chart of its data', async () => {
  const r = await sandbox.runCode(
    [
      'import matplotlib.pyplot as plt',
      'plt.figure()',
      'plt.plot([1, 2, 3], [10, 20, 15], label="sales")',
      'plt.title("Sales"); plt.xlabel("day (d)"); plt.ylabel("units")',
      'plt.legend(); plt.show()',
    ].join('\n'),
  )
  assert.equal(r.error, undefined, r.error && r.error.traceback)
  assert.equal(r.results.length, 1)
  const res = r.results[0]
  assert.ok(res.png && Buffer.from(res.png, 'base64').subarray(1, 4).toString() === 'PNG', 'no PNG in the result')
  const c = res.chart
  assert.ok(c, `no chart; formats ${res.formats()}`)
  assert.equal(c.type, 'line')
  assert.equal(c.title, 'Sales')
  assert.equal(c.x_label, 'day (d)')
  assert.equal(c.x_unit, 'd')
  assert.equal(c.y_label, 'units')
  assert.equal(c.elements.length, 1)
  assert.equal(c.elements[0].label, 'sales')
  assert.deepEqual(c.elements[0].points, [[1, 10], [2, 20], [3, 15]])
})

await check('bar, scatter, pie and box plots come as their charts with their elements', async () => {
  const r = await sandbox.runCode(
    [
      'import matplotlib.pyplot as plt',
      'fig, ax = plt.subplots(); ax.bar(["a", "b", "c"], [3, 5, 2], label="count"); ax.set_title("Bars"); plt.show()',
      'fig, ax = plt.subplots(); ax.scatter([1, 2, 3], [4, 5, 6], label="pts"); plt.show()',
      'fig, ax = plt.subplots(); ax.pie([1, 3], labels=["small", "big"]); plt.show()',
      'fig, ax = plt.subplots(); ax.boxplot([[1, 2, 3, 4, 5, 40], [2, 3, 4]], labels=["A", "B"]); plt.show()',
    ].join('\n'),
  )
  assert.equal(r.error, undefined, r.error && r.error.traceback)
  const charts = r.results.map((x) => x.chart)
  assert.deepEqual(charts.map((c) => c && c.type), ['bar', 'scatter', 'pie', 'box_and_whisker'])
  const [bar, scatter, pie, box] = charts
  assert.equal(bar.title, 'Bars')
  assert.deepEqual(bar.elements.map((e) => [e.label, e.value, e.group]), [['a', 3, 'count'], ['b', 5, 'count'], ['c', 2, 'count']])
  assert.deepEqual(scatter.elements[0].points, [[1, 4], [2, 5], [3, 6]])
  assert.deepEqual(pie.elements.map((e) => [e.label, Math.round(e.angle)]), [['small', 90], ['big', 270]])
  assert.deepEqual(box.elements.map((e) => [e.label, e.min, e.first_quartile, e.median, e.third_quartile, e.max, e.outliers]), [
    ['A', 1, 2.25, 3.5, 4.75, 5, [40]],
    ['B', 2, 2.5, 3, 3.5, 4, []],
  ])
})

await check('a DataFrame returns data, text and html', async () => {
  const r = await sandbox.runCode('import pandas as pd\npd.DataFrame({"city": ["Oslo", "Lima"], "temp": [4.5, 19.0]})')
  assert.equal(r.error, undefined, r.error && r.error.traceback)
  const res = r.results[0]
  assert.ok(res.isMainResult)
  assert.deepEqual(res.data, { city: ['Oslo', 'Lima'], temp: [4.5, 19] })
  assert.match(res.text, /Oslo/)
  assert.match(res.html, /<table/)
})

await check('display() of HTML and SVG', async () => {
  const r = await sandbox.runCode(
    [
      'from IPython.display import display, HTML, SVG',
      'display(HTML("<b>bold</b>"))',
      `display(SVG('<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"><rect width="4" height="4"/></svg>'))`,
    ].join('\n'),
  )
  assert.equal(r.results.length, 2)
  assert.equal(r.results[0].html, '<b>bold</b>')
  assert.equal(r.results[0].isMainResult, false)
  assert.match(r.results[1].svg, /^<svg[^>]*><rect/)
})

await check("an exception's name, value and traceback", async () => {
  const r = await sandbox.runCode('def f():\n    return 1 / 0\nf()')
  assert.equal(r.error.name, 'ZeroDivisionError')
  assert.equal(r.error.value, 'division by zero')
  assert.match(r.error.traceback, /----> 3 f\(\)/)
  assert.match(r.error.traceback, /return 1 \/ 0/)
  assert.equal(r.results.length, 0)
})

await check('envs of one call do not leak to the next', async () => {
  const r = await sandbox.runCode('import os\nos.environ.get("ONLY_ONCE")', { envs: { ONLY_ONCE: 'yes it is' } })
  assert.equal(r.text, 'yes it is')
  const after = await sandbox.runCode('os.environ.get("ONLY_ONCE", "gone")')
  assert.equal(after.text, 'gone')
})

await check('timeoutMs stops a while True and leaves the context usable', async () => {
  await sandbox.runCode('kept = "still here"')
  const started = Date.now()
  let err
  try {
    await sandbox.runCode('while True:\n    pass', { timeoutMs: 3_000 })
  } catch (e) {
    err = e
  }
  assert.ok(err instanceof TimeoutError, `want a TimeoutError, got ${err}`)
  assert.ok(Date.now() - started < 20_000)
  const r = await sandbox.runCode('kept + ", and " + str(1 + 1)', { timeoutMs: 30_000 })
  assert.equal(r.text, 'still here, and 2')
})

let ctx
await check('a context created with a cwd, listed, restarted (state gone), removed', async () => {
  ctx = await sandbox.createCodeContext({ cwd: '/tmp' })
  assert.equal(ctx.language, 'python')
  assert.equal(ctx.cwd, '/tmp')
  const cwd = await sandbox.runCode('import os\ny = 5\nos.getcwd()', { context: ctx })
  assert.equal(cwd.text, '/tmp')
  const listed = await sandbox.listCodeContexts()
  assert.ok(listed.some((c) => c.id === ctx.id && c.cwd === '/tmp' && c.language === 'python'), JSON.stringify(listed))
  assert.ok(listed.some((c) => c.language === 'javascript'), 'no default JavaScript context')
  assert.equal((await sandbox.runCode('y', { context: ctx })).text, '5')
  await sandbox.restartCodeContext(ctx)
  const gone = await sandbox.runCode('y', { context: ctx })
  assert.equal(gone.error && gone.error.name, 'NameError')
  assert.equal((await sandbox.runCode('import os; os.getcwd()', { context: ctx })).text, '/tmp')
  await sandbox.removeCodeContext(ctx)
  assert.ok(!(await sandbox.listCodeContexts()).some((c) => c.id === ctx.id))
  let err
  try {
    await sandbox.runCode('1', { context: ctx })
  } catch (e) {
    err = e
  }
  assert.ok(err instanceof NotFoundError, `a removed context: want NotFoundError, got ${err}`)
})

await check('JavaScript keeps state, awaits at top level and returns its last value', async () => {
  const seen = []
  const a = await sandbox.runCode('const base = 40\nconsole.log("from js")\nawait new Promise((r) => setTimeout(r, 50))\nbase + 1', {
    language: 'javascript',
    onStdout: (m) => seen.push(m.line),
  })
  assert.equal(a.error, undefined, a.error && a.error.traceback)
  assert.equal(a.text, '41')
  assert.deepEqual(seen, ['from js\n'])
  const b = await sandbox.runCode('base + 2', { language: 'js' })
  assert.equal(b.text, '42')
  const e = await sandbox.runCode('null.field', { language: 'javascript' })
  assert.equal(e.error.name, 'TypeError')
  assert.match(e.error.traceback, /TypeError/)
  const c = await sandbox.createCodeContext({ language: 'typescript' })
  const t = await sandbox.runCode('interface P { n: number }\nconst p: P = { n: 6 }\np.n * 7', { context: c })
  assert.equal(t.error, undefined, t.error && t.error.traceback)
  assert.equal(t.text, '42')
})

await check('a bash context keeps its variables and directory', async () => {
  const c = await sandbox.createCodeContext({ language: 'bash' })
  await sandbox.runCode('WHO=hutch; mkdir -p /tmp/bashctx && cd /tmp/bashctx', { context: c })
  const r = await sandbox.runCode('echo "$WHO in $(pwd)"', { context: c })
  assert.deepEqual(r.logs.stdout, ['hutch in /tmp/bashctx\n'])
})

await check('timeoutMs stops a bash cell, the rest of the cell does not run and the shell keeps its state', async () => {
  const c = await sandbox.createCodeContext({ language: 'bash' })
  await sandbox.runCode('KEPT=yes; cd /tmp; f() { sleep 60; echo after-sleep-in-f; }', { context: c })
  let err
  try {
    await sandbox.runCode('f; echo after-f > /tmp/bash-interrupted', { context: c, timeoutMs: 2_000 })
  } catch (e) {
    err = e
  }
  assert.ok(err instanceof TimeoutError, `want a TimeoutError, got ${err}`)
  const r = await sandbox.runCode('echo "$KEPT $(pwd) $$"; [ -e /tmp/bash-interrupted ] && echo ran-on || echo stopped', { context: c, timeoutMs: 30_000 })
  const [line, verdict] = r.logs.stdout.join('').trim().split('\n')
  assert.match(line, /^yes \/tmp \d+$/, r.logs.stdout.join(''))
  assert.equal(verdict, 'stopped')
  const again = await sandbox.runCode('echo $$', { context: c })
  assert.equal(again.logs.stdout.join('').trim(), line.split(' ')[2], 'the shell was restarted')
})

await check('an unsupported language is a clear 400', async () => {
  let err
  try {
    await sandbox.runCode('x', { language: 'cobol' })
  } catch (e) {
    err = e
  }
  assert.ok(err, 'runCode in cobol did not fail')
  assert.match(String(err), /400/)
  const res = await fetch(`${sandbox.jupyterUrl}/execute`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'X-Access-Token': sandbox.envdAccessToken },
    body: JSON.stringify({ code: '1', language: 'python', context_id: 'abc' }),
  })
  assert.equal(res.status, 400)
  assert.match(await res.text(), /Only one of context_id or language/)
})

await check('20 contexts in one sandbox, each with its own state', async (note) => {
  const t0 = Date.now()
  const ctxs = []
  for (let i = 0; i < 20; i += 5) {
    ctxs.push(...(await Promise.all([0, 1, 2, 3, 4].map(() => sandbox.createCodeContext()))))
  }
  note(`20 Python contexts started in ${Date.now() - t0} ms`)
  await Promise.all(ctxs.map((c, i) => sandbox.runCode(`mine = ${i}`, { context: c })))
  const back = await Promise.all(ctxs.map((c) => sandbox.runCode('mine * 10', { context: c })))
  assert.deepEqual(back.map((r) => r.text), ctxs.map((_, i) => String(i * 10)))
  for (const c of ctxs) await sandbox.removeCodeContext(c)
}, { timeoutMs: 300_000 })

await check('each sandbox of the template draws its own random numbers, in Python and JavaScript', async () => {
  const other = await Sandbox.create({ metadata: { run: runID }, timeoutMs: 300_000 })
  created.push(other)
  const third = await Sandbox.create({ metadata: { run: runID }, timeoutMs: 300_000 })
  created.push(third)
  const code = 'import random\nrandom.random()'
  const [a, b] = await Promise.all([sandbox.runCode(code), other.runCode(code)])
  assert.ok(a.text && b.text && a.text !== b.text, `both drew ${a.text}`)
  // Neither sandbox ran JavaScript before: their contexts are the
  // template's.
  const js = 'const c = require("node:crypto");\n[Math.random(), c.randomUUID(), c.randomBytes(8).toString("hex")].join(" ")'
  const [x, y] = await Promise.all([other.runCode(js, { language: 'javascript' }), third.runCode(js, { language: 'javascript' })])
  assert.equal(x.error, undefined, x.error && x.error.traceback)
  const xs = x.text.split(' ')
  const ys = y.text.split(' ')
  assert.equal(xs.length, 3, x.text)
  for (let i = 0; i < 3; i++) assert.notEqual(xs[i], ys[i], `both drew ${x.text}`)
  await other.kill()
  await third.kill()
}, { timeoutMs: 240_000 })

await check('envs given at create reach the warm kernels and new contexts', async () => {
  const sb = await Sandbox.create({ metadata: { run: runID }, envs: { FROM_CREATE: 'given at create', HOME_TOO: 'x y' }, timeoutMs: 300_000 })
  created.push(sb)
  const py = await sb.runCode('import os\n(os.environ.get("FROM_CREATE"), os.environ.get("HOME_TOO"))')
  assert.equal(py.text, "('given at create', 'x y')")
  const js = await sb.runCode('process.env.FROM_CREATE', { language: 'javascript' })
  assert.equal(js.text, 'given at create')
  const c = await sb.createCodeContext({ language: 'bash' })
  const sh = await sb.runCode('echo "$FROM_CREATE"', { context: c })
  assert.deepEqual(sh.logs.stdout, ['given at create\n'])
  const once = await sb.runCode('os.environ["FROM_CREATE"]', { envs: { FROM_CREATE: 'for one call' } })
  assert.equal(once.text, 'for one call')
  assert.equal((await sb.runCode('os.environ["FROM_CREATE"]')).text, 'given at create')
  await sb.kill()
}, { timeoutMs: 180_000 })

await check('another tenant and a wrong token get nothing', async () => {
  let err
  try {
    await Sandbox.connect(sandbox.sandboxId, { apiKey: process.env.HUTCH_OTHER_KEY })
  } catch (e) {
    err = e
  }
  assert.ok(err, 'another tenant connected to the sandbox')
  const theirs = await Sandbox.list({ apiKey: process.env.HUTCH_OTHER_KEY }).nextItems()
  assert.ok(!theirs.some((s) => s.sandboxId === sandbox.sandboxId))
  const token = sandbox.envdAccessToken
  assert.ok(token, 'the sandbox has no access token')
  sandbox.envdAccessToken = 'not-' + token
  err = undefined
  try {
    await sandbox.runCode('secret = 1')
  } catch (e) {
    err = e
  } finally {
    sandbox.envdAccessToken = token
  }
  assert.ok(err, 'runCode with a wrong token ran')
  const none = await fetch(`${sandbox.jupyterUrl}/execute`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ code: 'secret = 2' }),
  })
  assert.notEqual(none.status, 200)
  const r = await sandbox.runCode("'secret' in dir()")
  assert.equal(r.text, 'False')
})

console.log(`KEEP ${sandbox ? sandbox.sandboxId : ''}`)
done()
