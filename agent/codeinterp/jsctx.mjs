// One JavaScript or TypeScript context of hutch's code interpreter: a Node
// process that runs each piece of code it is sent in one node:vm context,
// so that what the code declares lasts until the next. server.py starts it
// and speaks JSON lines with it on the socket it passes as fd
// $HUTCH_CODEINTERP_FD:
//
//   in:  {"id", "code", "typescript": bool, "env": {K: V}}
//        {"id", "setenv": {K: V}}   (for good, not for one execution)
//   out: {"id", "type": "stdout"|"stderr", "text"}
//        {"id", "type": "result", "data": {MIME: value}, "main": bool}
//        {"id", "type": "error", "name", "value", "traceback"}
//        {"id", "type": "done"}
//
// Top-level await works; the value of the last expression is the result;
// console output is streamed as it is written. TypeScript is compiled with
// the typescript package's transpileModule (types are not checked).
import net from 'node:net'
import vm from 'node:vm'
import util from 'node:util'
import { Writable } from 'node:stream'
import path from 'node:path'
import { createRequire } from 'node:module'

const ownRequire = createRequire(import.meta.url)
const ts = ownRequire('typescript')

const chan = new net.Socket({ fd: Number(process.env.HUTCH_CODEINTERP_FD), readable: true, writable: true })
delete process.env.HUTCH_CODEINTERP_FD

let current = null // the id of the running execution
function send(obj) {
  chan.write(JSON.stringify(obj) + '\n')
}
function out(type, text) {
  if (current !== null && text.length > 0) send({ id: current, type, text })
}

// The context's global: Node's own globals that a fresh vm context lacks
// (timers, fetch, Buffer, process, URL...), plus require and a console
// that streams.
const sandbox = {}
const fresh = vm.runInNewContext('Object.getOwnPropertyNames(globalThis)')
for (const name of Object.getOwnPropertyNames(globalThis)) {
  if (fresh.includes(name) || name === 'globalThis' || name === 'console') continue
  const d = Object.getOwnPropertyDescriptor(globalThis, name)
  if (d) Object.defineProperty(sandbox, name, d)
}
const writer = (name) => new Writable({
  decodeStrings: false,
  write(chunk, enc, cb) {
    out(name, typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString())
    cb()
  },
})
const streamConsole = new console.Console({ stdout: writer('stdout'), stderr: writer('stderr') })
sandbox.console = streamConsole
sandbox.require = createRequire(path.join(process.cwd(), 'index.js'))
sandbox.module = { exports: {} }
sandbox.exports = sandbox.module.exports
sandbox.__filename = path.join(process.cwd(), '[context]')
sandbox.__dirname = process.cwd()
const context = vm.createContext(sandbox)

// Output the code's own process.stdout/stderr writes too.
for (const [name, stream] of [['stdout', process.stdout], ['stderr', process.stderr]]) {
  const write = stream.write.bind(stream)
  stream.write = (chunk, enc, cb) => {
    if (current === null) return write(chunk, enc, cb)
    out(name, typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString())
    if (typeof enc === 'function') enc()
    else if (typeof cb === 'function') cb()
    return true
  }
}

// hasTopLevelAwait: an await (or for await) outside every function.
function hasTopLevelAwait(sf) {
  let found = false
  const visit = (n) => {
    if (found) return
    if (ts.isFunctionLike(n) || ts.isClassLike(n)) return
    if (ts.isAwaitExpression(n) || (ts.isForOfStatement(n) && n.awaitModifier)) {
      found = true
      return
    }
    ts.forEachChild(n, visit)
  }
  ts.forEachChild(sf, visit)
  return found
}

function boundNames(name, names) {
  if (ts.isIdentifier(name)) names.push(name.text)
  else for (const el of name.elements) if (!ts.isOmittedExpression(el)) boundNames(el.name, names)
}

// rewrite turns code into a script for the context. Without top-level
// await it runs as it is, its let and const made var so that a piece of
// code can be run again; its completion value is the result. With it, the
// code runs in an async function: its declarations become assignments
// to globals declared before it, and its last expression is returned.
function rewrite(code) {
  const sf = ts.createSourceFile('cell.js', code, ts.ScriptTarget.Latest, true, ts.ScriptKind.JS)
  const edits = [] // [start, end, text]
  const asyncBody = hasTopLevelAwait(sf)
  const hoisted = []
  const stmts = sf.statements
  stmts.forEach((s, i) => {
    const last = i === stmts.length - 1
    if (ts.isVariableStatement(s)) {
      const list = s.declarationList
      if (!asyncBody) {
        if (list.flags & (ts.NodeFlags.Let | ts.NodeFlags.Const)) {
          const kw = code.slice(list.getStart(sf)).match(/^(let|const)/)
          if (kw) edits.push([list.getStart(sf), list.getStart(sf) + kw[1].length, 'var'])
        }
        return
      }
      const parts = []
      for (const d of list.declarations) {
        boundNames(d.name, hoisted)
        if (d.initializer) parts.push(`${d.name.getText(sf)} = ${d.initializer.getText(sf)}`)
      }
      edits.push([s.getStart(sf), s.getEnd(), parts.length ? `(${parts.join(', ')});` : ';'])
      return
    }
    if (!asyncBody) return
    if (ts.isFunctionDeclaration(s) && s.name) {
      hoisted.push(s.name.text)
      edits.push([s.getEnd(), s.getEnd(), `\nglobalThis[${JSON.stringify(s.name.text)}] = ${s.name.text};`])
    } else if (ts.isClassDeclaration(s) && s.name) {
      hoisted.push(s.name.text)
      edits.push([s.getStart(sf), s.getStart(sf), `${s.name.text} = `])
      edits.push([s.getEnd(), s.getEnd(), ';'])
    } else if (last && ts.isExpressionStatement(s)) {
      edits.push([s.getStart(sf), s.getEnd(), `return (${s.expression.getText(sf)});`])
    }
  })
  let body = code
  for (const [start, end, text] of edits.sort((a, b) => b[0] - a[0])) {
    body = body.slice(0, start) + text + body.slice(end)
  }
  if (!asyncBody) return { script: body, async: false }
  const decl = hoisted.length ? `var ${[...new Set(hoisted)].join(', ')};\n` : ''
  return { script: `${decl}(async () => {\n${body}\n})()`, async: true }
}

function transpile(code) {
  const r = ts.transpileModule(code, {
    compilerOptions: {
      target: ts.ScriptTarget.ES2022,
      module: ts.ModuleKind.CommonJS,
      esModuleInterop: true,
      sourceMap: false,
    },
    reportDiagnostics: false,
  })
  return r.outputText
}

function display(value) {
  const bundleOf = value !== null && (typeof value === 'object' || typeof value === 'function') && value[Symbol.for('Jupyter.display')]
  if (typeof bundleOf === 'function') {
    const b = bundleOf.call(value)
    if (b && typeof b === 'object') return b
  }
  return { 'text/plain': util.inspect(value, { depth: 4, colors: false }) }
}

// ownFrames is a stack without the frames of this runner and of node:vm
// below the code's own.
function ownFrames(stack) {
  const lines = stack.split('\n')
  const cut = lines.findIndex((l) => /^\s+at /.test(l) && /node:vm|jsctx\.mjs|sigintHandlersWrap/.test(l))
  return (cut > 0 ? lines.slice(0, cut) : lines).join('\n')
}

let interrupted = null
process.on('SIGINT', () => {
  if (interrupted) interrupted(new Error('KeyboardInterrupt: the execution was interrupted'))
})

async function run(req) {
  current = req.id
  const env = req.env || {}
  const saved = {}
  for (const [k, v] of Object.entries(env)) {
    saved[k] = Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : undefined
    process.env[k] = v
  }
  try {
    const code = req.typescript ? transpile(req.code) : req.code
    const { script, async: isAsync } = rewrite(code)
    let value = new vm.Script(script, { filename: 'cell' }).runInContext(context, { breakOnSigint: true, displayErrors: true })
    // The async body's promise, or a promise the code ended with.
    if (isAsync || (value !== null && typeof value === 'object' && typeof value.then === 'function')) {
      value = await new Promise((resolve, reject) => {
        interrupted = reject
        value.then(resolve, reject)
      })
    }
    if (value !== undefined) send({ id: req.id, type: 'result', data: display(value), main: true })
  } catch (e) {
    const err = e instanceof Error || (e && typeof e === 'object' && 'stack' in e)
      ? { name: e.name || 'Error', value: String(e.message ?? e), traceback: ownFrames(String(e.stack || '')) }
      : { name: 'Error', value: util.inspect(e), traceback: '' }
    if (/Script execution was interrupted/.test(err.value)) err.name = 'KeyboardInterrupt'
    send({ id: req.id, type: 'error', ...err })
  } finally {
    interrupted = null
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k]
      else process.env[k] = v
    }
    current = null
    send({ id: req.id, type: 'done' })
  }
}

// Executions run one after the other, in the order they came.
let queue = Promise.resolve()
let buf = ''
chan.setEncoding('utf8')
chan.on('data', (chunk) => {
  buf += chunk
  let i
  while ((i = buf.indexOf('\n')) >= 0) {
    const line = buf.slice(0, i)
    buf = buf.slice(i + 1)
    if (!line) continue
    const req = JSON.parse(line)
    if (req.setenv) {
      queue = queue.then(() => {
        Object.assign(process.env, req.setenv)
        send({ id: req.id, type: 'done' })
      })
      continue
    }
    queue = queue.then(() => run(req))
  }
})
chan.on('end', () => process.exit(0))
process.on('uncaughtException', (e) => {
  out('stderr', `Uncaught ${e && e.stack ? e.stack : e}\n`)
})
process.on('unhandledRejection', (e) => {
  out('stderr', `Unhandled rejection: ${e && e.stack ? e.stack : e}\n`)
})
send({ type: 'ready' })
