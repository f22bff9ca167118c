// The console's pages. Every value that comes from a sandbox or a tenant
// is put in the page with textContent or as an attribute value, never as
// markup.
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import uPlot from 'uplot';
import RFB from '@novnc/novnc';

const P = '/console';

// xterm.js writes its theme and dimensions into <style> elements, which
// style-src 'self' refuses. Its style elements become constructed style
// sheets instead (CSSOM, which the policy allows): the same rules, no
// inline markup.
const createElement = Document.prototype.createElement;
Document.prototype.createElement = function (tag, opts) {
  if (String(tag).toLowerCase() !== 'style') return createElement.call(this, tag, opts);
  const e = createElement.call(this, 'hutch-style', opts);
  const sheet = new CSSStyleSheet();
  let text = '';
  document.adoptedStyleSheets = [...document.adoptedStyleSheets, sheet];
  Object.defineProperty(e, 'textContent', { get: () => text, set: (v) => { text = String(v); sheet.replaceSync(text); } });
  const remove = e.remove.bind(e);
  e.remove = () => { document.adoptedStyleSheets = document.adoptedStyleSheets.filter((x) => x !== sheet); remove(); };
  return e;
};
let csrf = '';
let domain = '';
let stopView = () => {};

function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === 'on') for (const [ev, f] of Object.entries(v)) e.addEventListener(ev, f);
    else if (k === 'text') e.textContent = v;
    else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}

async function call(method, path, body, raw) {
  const h = {};
  if (method !== 'GET') h['X-Hutch-Csrf'] = csrf;
  let b = body;
  if (body !== undefined && !raw) { h['Content-Type'] = 'application/json'; b = JSON.stringify(body); }
  const r = await fetch(P + path, { method, headers: h, body: b, credentials: 'same-origin' });
  if (r.status === 401 && path !== '/session') { showSignIn('Signed out: ' + (await r.text())); throw new Error('signed out'); }
  if (!r.ok) throw new Error(method + ' ' + path + ': ' + r.status + ' ' + (await r.text()));
  return r;
}
const getJSON = async (p) => (await call('GET', p)).json();

function show(...nodes) {
  stopView(); stopView = () => {};
  const m = document.getElementById('main');
  m.replaceChildren(...nodes);
}

function errBox() { return el('div', { class: 'err', id: 'error' }); }
function fail(box, e) { box.textContent = String(e && e.message || e); }

function showSignIn(msg) {
  document.getElementById('signout').hidden = true;
  const key = el('input', { type: 'password', id: 'apikey', autocomplete: 'off', size: '50' });
  const box = errBox();
  if (msg) box.textContent = msg;
  const form = el('form', { id: 'signin', class: 'card', on: { submit: async (e) => {
    e.preventDefault();
    const r = await fetch(P + '/session', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ apiKey: key.value }) });
    if (!r.ok) { box.textContent = 'Sign in failed: ' + (await r.text()); return; }
    const s = await r.json(); csrf = s.csrf; domain = s.domain || '';
    history.pushState(null, '', P + '/'); route();
  } } }, el('h2', { text: 'Sign in' }), el('label', {}, 'API key', key), el('button', { type: 'submit', id: 'signin-submit', text: 'Sign in' }), box);
  show(form);
}

function age(t) {
  const s = Math.max(0, Math.floor((Date.now() - new Date(t)) / 1000));
  return s < 60 ? s + ' s' : s < 3600 ? Math.floor(s / 60) + ' min' : Math.floor(s / 3600) + ' h';
}
const mib = (b) => (b / 1048576).toFixed(0) + ' MiB';

function createForm(onDone) {
  const f = (id, label, attrs = {}) => { const i = el('input', { id, ...attrs }); return [i, el('label', {}, label, i)]; };
  const [tpl, tplL] = f('c-template', 'Template', { value: 'base' });
  const [life, lifeL] = f('c-lifetime', 'Lifetime (s)', { type: 'number', value: '300', min: '1' });
  const [meta, metaL] = f('c-metadata', 'Metadata (k=v, comma-separated)');
  const [allow, allowL] = f('c-allow', 'Allow out (comma-separated)');
  const [deny, denyL] = f('c-deny', 'Deny out (comma-separated)');
  const box = errBox();
  const list = (s) => s.split(',').map((x) => x.trim()).filter(Boolean);
  return el('form', { id: 'create', class: 'card', on: { submit: async (e) => {
    e.preventDefault(); box.textContent = '';
    const body = { templateID: tpl.value, timeout: Number(life.value) };
    const md = {};
    for (const kv of list(meta.value)) { const i = kv.indexOf('='); if (i > 0) md[kv.slice(0, i)] = kv.slice(i + 1); }
    if (Object.keys(md).length) body.metadata = md;
    if (allow.value || deny.value) body.network = { allowOut: list(allow.value), denyOut: list(deny.value) };
    try { await call('POST', '/api/sandboxes', body); onDone(); } catch (err) { fail(box, err); }
  } } }, el('h3', { text: 'Create a sandbox' }), el('div', { class: 'row' }, tplL, lifeL, metaL, allowL, denyL, el('button', { type: 'submit', id: 'c-submit', text: 'Create' })), box);
}

function showList() {
  const tbody = el('tbody', { id: 'sandboxes' });
  const box = errBox();
  let timer;
  const refresh = async () => {
    try {
      const sbs = await getJSON('/api/v2/sandboxes?state=running,paused&limit=100');
      let m = {};
      const ids = sbs.filter((s) => s.state === 'running').map((s) => s.sandboxID);
      if (ids.length) m = (await getJSON('/api/sandboxes/metrics?sandbox_ids=' + encodeURIComponent(ids.join(',')))).sandboxes || {};
      tbody.replaceChildren(...sbs.map((s) => {
        const mt = m[s.sandboxID];
        const a = el('a', { href: P + '/sandbox/' + encodeURIComponent(s.sandboxID), class: 'sb-link', text: s.sandboxID });
        a.addEventListener('click', (e) => { e.preventDefault(); history.pushState(null, '', a.getAttribute('href')); route(); });
        const md = Object.entries(s.metadata || {}).map(([k, v]) => k + '=' + v).join(', ');
        return el('tr', { 'data-id': s.sandboxID }, el('td', {}, a), el('td', { class: 'state-' + s.state, text: s.state }),
          el('td', { text: s.alias || s.templateID }), el('td', { text: age(s.startedAt) }),
          el('td', { text: mt ? mt.cpuUsedPct.toFixed(1) + ' %' : '' }), el('td', { text: mt ? mib(mt.memUsed) + ' / ' + mib(mt.memTotal) : '' }),
          el('td', { class: 'metadata', text: md }));
      }));
      box.textContent = '';
    } catch (e) { fail(box, e); }
  };
  const head = el('tr', {}, ...['ID', 'State', 'Template', 'Age', 'CPU', 'Memory', 'Metadata'].map((h) => el('th', { text: h })));
  show(createForm(refresh), el('div', { class: 'card' }, el('h3', { text: 'Sandboxes' }), el('table', {}, el('thead', {}, head), tbody), box));
  refresh();
  timer = setInterval(refresh, 2000);
  stopView = () => clearInterval(timer);
}

// showOperator is the operator's view (signed in with serve's operator
// key, which acts as no tenant): every tenant's quota and what it holds,
// and every tenant's sandboxes, every 2 s.
function showOperator() {
  const tenants = el('tbody', { id: 'op-tenants' });
  const sandboxes = el('tbody', { id: 'op-sandboxes' });
  const box = errBox();
  const of = (used, max, f = String) => f(used) + (max ? ' / ' + f(max) : '');
  const refresh = async () => {
    try {
      const ts = await getJSON('/api/operator/tenants');
      tenants.replaceChildren(...ts.map((t) => { const q = t.quota || {}; const u = t.use; return el('tr', { 'data-tenant': t.name },
        el('td', { class: 'tenant', text: t.name }), el('td', { class: 'op-sandboxes', text: of(u.sandboxes, q.max_sandboxes) }),
        el('td', { text: of(u.cpus, q.max_cpus) }), el('td', { text: of(u.memoryBytes, q.max_memory, mib) }),
        el('td', { text: of(u.diskBytes, q.max_disk, mib) }), el('td', { text: of(u.snapshots, q.max_snapshots) })); }));
      sandboxes.replaceChildren(...ts.flatMap((t) => t.sandboxes.map((sb) => {
        const md = Object.entries(sb.metadata || {}).map(([k, v]) => k + '=' + v).join(', ');
        return el('tr', { 'data-id': sb.sandboxID }, el('td', { text: sb.sandboxID }), el('td', { class: 'tenant', text: t.name }),
          el('td', { class: 'state-' + sb.state, text: sb.state }), el('td', { text: sb.alias || sb.templateID }), el('td', { text: age(sb.startedAt) }),
          el('td', { text: sb.cpuCount + ' CPU, ' + sb.memoryMB + ' MiB' }), el('td', { class: 'metadata', text: md }));
      })));
      box.textContent = '';
    } catch (e) { fail(box, e); }
  };
  const th = (...hs) => el('thead', {}, el('tr', {}, ...hs.map((h) => el('th', { text: h }))));
  show(el('div', { class: 'card' }, el('h2', { text: 'Operator' }), el('h3', { text: 'Tenants: in use / quota' }),
    el('table', {}, th('Tenant', 'Sandboxes', 'CPUs', 'Memory', 'Disk', 'Snapshots'), tenants), box),
  el('div', { class: 'card' }, el('h3', { text: 'Every sandbox' }), el('table', {}, th('ID', 'Tenant', 'State', 'Template', 'Age', 'Limits', 'Metadata'), sandboxes)));
  refresh();
  const timer = setInterval(refresh, 2000);
  stopView = () => clearInterval(timer);
}

// Connect RPC over fetch, JSON codec, as E2B's SDK calls envd.
const enc = new TextEncoder();
const dec = new TextDecoder();
function envelope(msg) {
  const b = enc.encode(JSON.stringify(msg));
  const out = new Uint8Array(5 + b.length);
  new DataView(out.buffer).setUint32(1, b.length);
  out.set(b, 5);
  return out;
}
async function unary(id, method, msg) {
  return (await call('POST', '/envd/' + encodeURIComponent(id) + '/' + method, msg)).json();
}
async function stream(id, method, msg, onMsg, signal) {
  const r = await fetch(P + '/envd/' + encodeURIComponent(id) + '/' + method, {
    method: 'POST', signal, body: envelope(msg),
    headers: { 'Content-Type': 'application/connect+json', 'Connect-Protocol-Version': '1', 'Keepalive-Ping-Interval': '50', 'X-Hutch-Csrf': csrf },
  });
  if (!r.ok) throw new Error(method + ': ' + r.status + ' ' + (await r.text()));
  const rd = r.body.getReader();
  let buf = new Uint8Array(0);
  for (;;) {
    const { value, done } = await rd.read();
    if (done) return;
    const nb = new Uint8Array(buf.length + value.length); nb.set(buf); nb.set(value, buf.length); buf = nb;
    while (buf.length >= 5) {
      const n = new DataView(buf.buffer, buf.byteOffset).getUint32(1);
      if (buf.length < 5 + n) break;
      const flags = buf[0];
      const m = JSON.parse(dec.decode(buf.subarray(5, 5 + n)));
      buf = buf.slice(5 + n);
      if (flags & 2) { if (m.error) throw new Error(m.error.message || m.error.code); return; }
      onMsg(m);
    }
  }
}
const b64 = (s) => { let bin = ''; for (const c of enc.encode(s)) bin += String.fromCharCode(c); return btoa(bin); };
const unb64 = (s) => Uint8Array.from(atob(s), (c) => c.charCodeAt(0));

function terminal(id, host) {
  const term = new Terminal({ convertEol: false, fontSize: 13 });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(host);
  fit.fit();
  const ac = new AbortController();
  let pid = 0;
  stream(id, 'process.Process/Start', {
    process: { cmd: '/bin/bash', args: ['-i', '-l'], envs: { TERM: 'xterm-256color', LANG: 'C.UTF-8', LC_ALL: 'C.UTF-8' } },
    pty: { size: { cols: term.cols, rows: term.rows } },
  }, (m) => {
    const ev = m.event || {};
    if (ev.start) pid = ev.start.pid;
    if (ev.data && ev.data.pty) term.write(unb64(ev.data.pty));
    if (ev.end) term.write('\r\n[process ended]\r\n');
  }, ac.signal).catch((e) => { if (!ac.signal.aborted) term.write('\r\n[' + e.message + ']\r\n'); });
  let queue = Promise.resolve();
  term.onData((d) => {
    if (!pid) return;
    queue = queue.then(() => unary(id, 'process.Process/SendInput', { process: { pid }, input: { pty: b64(d) } })).catch(() => {});
  });
  term.onResize(({ cols, rows }) => {
    if (pid) unary(id, 'process.Process/Update', { process: { pid }, pty: { size: { cols, rows } } }).catch(() => {});
  });
  const onWin = () => fit.fit();
  window.addEventListener('resize', onWin);
  return () => { ac.abort(); window.removeEventListener('resize', onWin); if (pid) unary(id, 'process.Process/SendSignal', { process: { pid }, signal: 'SIGNAL_SIGKILL' }).catch(() => {}); term.dispose(); };
}

function files(id) {
  const dir = el('input', { id: 'f-dir', value: '/home/user', size: '40' });
  const tbody = el('tbody', { id: 'files' });
  const box = errBox();
  const list = async () => {
    try {
      const r = await unary(id, 'filesystem.Filesystem/ListDir', { path: dir.value, depth: 1 });
      tbody.replaceChildren(...(r.entries || []).map((e) => {
        const dl = el('a', { href: P + '/envd/' + encodeURIComponent(id) + '/files?path=' + encodeURIComponent(e.path), download: e.name, text: 'download' });
        return el('tr', {}, el('td', { class: 'fname', text: e.name }), el('td', { text: (e.type || '').replace('FILE_TYPE_', '').toLowerCase() }), el('td', { text: e.size || '' }), el('td', {}, e.type === 'FILE_TYPE_FILE' ? dl : ''));
      }));
      box.textContent = '';
    } catch (e) { fail(box, e); }
  };
  const up = el('input', { type: 'file', id: 'f-upload' });
  up.addEventListener('change', async () => {
    for (const f of up.files) {
      const fd = new FormData(); fd.append('file', f, f.name);
      try { await call('POST', '/envd/' + encodeURIComponent(id) + '/files?path=' + encodeURIComponent(dir.value.replace(/\/$/, '') + '/' + f.name), fd, true); } catch (e) { fail(box, e); }
    }
    up.value = ''; list();
  });
  list();
  return el('div', { class: 'card' }, el('h3', { text: 'Files' }), el('div', { class: 'row' }, el('label', {}, 'Directory', dir), el('button', { id: 'f-list', text: 'List', on: { click: list } }), el('label', {}, 'Upload', up)), el('table', {}, tbody), box);
}

function charts(id, host) {
  let plots = [];
  const draw = async () => {
    try {
      const ms = await getJSON('/api/sandboxes/' + encodeURIComponent(id) + '/metrics');
      const t = ms.map((m) => m.timestampUnix);
      const series = [['CPU %', ms.map((m) => m.cpuUsedPct)], ['Memory MiB', ms.map((m) => m.memUsed / 1048576)], ['Disk MiB', ms.map((m) => m.diskUsed / 1048576)]];
      plots.forEach((p) => p.destroy()); plots = [];
      host.replaceChildren();
      for (const [name, ys] of series) {
        const d = el('div', { class: 'chart', 'data-points': String(ys.length) });
        host.append(d);
        plots.push(new uPlot({ width: 380, height: 180, title: name, series: [{}, { label: name, stroke: '#2a6fdb', fill: 'rgba(42,111,219,.15)' }] }, [t, ys], d));
      }
    } catch (e) { host.textContent = String(e.message); }
  };
  draw();
  const timer = setInterval(draw, 5000);
  return () => { clearInterval(timer); plots.forEach((p) => p.destroy()); };
}

// logs follows the sandbox's log (its background processes' output,
// GET /sandboxes/ID/logs) while follow is checked: each second, the lines
// after the last one shown; at most maxLogLines are kept.
const maxLogLines = 2000;
function logs(id) {
  const pre = el('div', { id: 'logs', class: 'logs' });
  const follow = el('input', { type: 'checkbox', id: 'l-follow' });
  follow.checked = true;
  const box = errBox();
  let next = 0;
  let busy = false;
  const poll = async () => {
    if (!follow.checked || busy) return;
    busy = true;
    try {
      const r = await getJSON('/api/sandboxes/' + encodeURIComponent(id) + '/logs?' + (next ? 'start=' + next : 'limit=200'));
      const lines = r.logs || [];
      for (const l of lines) {
        const t = new Date(l.timestamp);
        pre.append(el('div', { class: 'logline' }, el('span', { class: 'ts', text: t.toLocaleTimeString() + ' ' }), el('span', { class: 'line', text: l.line })));
        next = Math.max(next, t.getTime() + 1);
      }
      while (pre.childElementCount > maxLogLines) pre.firstElementChild.remove();
      if (lines.length) pre.scrollTop = pre.scrollHeight;
      box.textContent = '';
    } catch (e) { fail(box, e); }
    busy = false;
  };
  poll();
  const timer = setInterval(poll, 1000);
  const card = el('div', { class: 'card' }, el('h3', { text: 'Logs' }), el('label', {}, follow, ' follow'), pre, box);
  return [card, () => clearInterval(timer)];
}

// screen shows a desktop sandbox's screen with noVNC: serve starts the
// sandbox's VNC server (POST /sandboxes/ID/screen) and the console
// bridges /console/screen/ID, on its own origin, to it.
function screen(id) {
  const host = el('div', { id: 'screen', class: 'screen' });
  const status = el('span', { id: 'screen-status' });
  const box = errBox();
  let rfb = null;
  const stop = () => { if (rfb) { const r = rfb; rfb = null; r.disconnect(); } };
  const start = async () => {
    box.textContent = ''; stop();
    try {
      await call('POST', '/api/sandboxes/' + encodeURIComponent(id) + '/screen', {});
    } catch (e) { fail(box, e); return; }
    const url = (location.protocol === 'https:' ? 'wss:' : 'ws:') + '//' + location.host + P + '/screen/' + encodeURIComponent(id);
    status.textContent = 'connecting';
    const r = new RFB(host, url, { shared: true });
    r.scaleViewport = true;
    r.addEventListener('connect', () => { status.textContent = 'connected'; });
    r.addEventListener('disconnect', (e) => { status.textContent = e.detail && e.detail.clean ? 'disconnected' : 'connection lost'; if (rfb === r) rfb = null; });
    r.addEventListener('securityfailure', (e) => { fail(box, 'VNC: ' + ((e.detail && e.detail.reason) || 'security failure')); });
    rfb = r;
  };
  const card = el('div', { class: 'card' }, el('h3', { text: 'Screen' }),
    el('div', { class: 'row' }, el('button', { id: 's-show', text: 'show screen', on: { click: start } }), el('button', { id: 's-hide', text: 'hide', on: { click: stop } }), status), host, box);
  return [card, stop];
}

// checkpoints lists the sandbox's checkpoints, each to go back to or to
// fork from.
function checkpoints(id, onFork) {
  const q = encodeURIComponent(id);
  const tbody = el('tbody', { id: 'checkpoints' });
  const box = errBox();
  const list = async () => {
    try {
      const cks = await getJSON('/api/sandboxes/' + q + '/checkpoints');
      tbody.replaceChildren(...cks.map((c) => {
        const b = (name, f) => el('button', { class: 'ck-' + name, text: name, on: { click: async () => { try { box.textContent = ''; await f(); await list(); } catch (e) { fail(box, e); } } } });
        const cq = encodeURIComponent(c.checkpointID);
        return el('tr', { 'data-checkpoint': c.checkpointID }, el('td', { text: c.checkpointID }), el('td', { text: new Date(c.createdAt).toLocaleTimeString() }),
          el('td', { text: c.message || '' }), el('td', { text: mib(c.sizeBytes) }),
          el('td', {}, b('restore', () => call('POST', '/api/sandboxes/' + q + '/checkpoints/' + cq + '/restore', {})),
            b('fork', async () => onFork(await (await call('POST', '/api/sandboxes/' + q + '/fork', { checkpointID: c.checkpointID })).json()))));
      }));
      box.textContent = '';
    } catch (e) { fail(box, e); }
  };
  list();
  return [el('div', { class: 'card' }, el('h3', { text: 'Checkpoints' }), el('table', {}, tbody), box), list];
}

async function showSandbox(id) {
  const box = errBox();
  const title = el('h2', { id: 'sb-title', text: id });
  const state = el('span', { id: 'sb-state' });
  const info = el('div', { id: 'sb-info' });
  const act = (name, f) => el('button', { id: 'b-' + name, text: name, on: { click: async () => { try { box.textContent = ''; await f(); await load(); } catch (e) { fail(box, e); } } } });
  const q = encodeURIComponent(id);
  const port = el('input', { id: 'p-port', type: 'number', value: '8000', min: '1', max: '65535' });
  const plink = el('a', { id: 'p-link', target: '_blank', rel: 'noopener noreferrer' });
  const setLink = () => {
    const d = domain || location.hostname;
    const href = location.protocol + '//' + Number(port.value) + '-' + id + '.' + d + (location.port ? ':' + location.port : '') + '/';
    plink.setAttribute('href', href); plink.textContent = href;
  };
  port.addEventListener('input', setLink);
  const load = async () => {
    const sb = await getJSON('/api/sandboxes/' + q);
    state.textContent = sb.state; state.className = 'state-' + sb.state;
    const md = Object.entries(sb.metadata || {}).map(([k, v]) => k + '=' + v).join(', ');
    info.textContent = 'template ' + (sb.alias || sb.templateID) + ' · ' + sb.cpuCount + ' CPU · ' + sb.memoryMB + ' MiB · started ' + age(sb.startedAt) + ' ago · ends ' + new Date(sb.endAt).toLocaleTimeString() + (md ? ' · ' + md : '');
    return sb;
  };
  const termHost = el('div', { id: 'term' });
  const chartHost = el('div', { class: 'charts', id: 'charts' });
  const result = el('div', { id: 'sb-result' });
  const forked = (out) => {
    const kid = (out || []).map((k) => k.sandbox && k.sandbox.sandboxID).find(Boolean);
    if (!kid) throw new Error('fork: ' + JSON.stringify(out));
    const a = el('a', { id: 'fork-link', href: P + '/sandbox/' + encodeURIComponent(kid), text: kid });
    a.addEventListener('click', (e) => { e.preventDefault(); history.pushState(null, '', a.getAttribute('href')); route(); });
    result.replaceChildren('forked: ', a);
  };
  const [ckCard, ckList] = checkpoints(id, forked);
  const actions = el('div', { class: 'row' },
    act('pause', () => call('POST', '/api/sandboxes/' + q + '/pause')),
    act('resume', () => call('POST', '/api/sandboxes/' + q + '/resume', {})),
    act('snapshot', async () => { const r = await (await call('POST', '/api/sandboxes/' + q + '/snapshots', {})).json(); result.replaceChildren('snapshot: ', el('code', { id: 'snapshot-id', text: r.snapshotID })); }),
    act('checkpoint', async () => { const r = await (await call('POST', '/api/sandboxes/' + q + '/checkpoints', {})).json(); result.replaceChildren('checkpoint: ', el('code', { id: 'checkpoint-id', text: r.checkpointID })); await ckList(); }),
    act('fork', async () => forked(await (await call('POST', '/api/sandboxes/' + q + '/fork', {})).json())),
    act('kill', async () => { await call('DELETE', '/api/sandboxes/' + q); history.pushState(null, '', P + '/'); route(); }));
  let sb;
  try { sb = await load(); } catch (e) { show(el('div', { class: 'card' }, el('h2', { text: id }), box)); fail(box, e); return; }
  const parts = [el('div', { class: 'card' }, title, state, info, actions, result, box), el('div', { class: 'card' }, el('h3', { text: 'Ports' }), el('div', { class: 'row' }, el('label', {}, 'Port', port), plink))];
  const stops = [];
  if (sb.state === 'running') {
    const [scCard, stopScreen] = screen(id);
    parts.push(el('div', { class: 'card' }, el('h3', { text: 'Terminal' }), termHost), files(id), scCard);
    stops.push(stopScreen);
  }
  parts.push(ckCard, el('div', { class: 'card' }, el('h3', { text: 'Metrics' }), chartHost));
  const [logCard, stopLogs] = logs(id);
  parts.push(logCard);
  show(...parts);
  setLink();
  stops.push(charts(id, chartHost), stopLogs);
  if (sb.state === 'running') stops.push(terminal(id, termHost));
  stopView = () => stops.forEach((f) => f());
}

async function route() {
  const s = await (await fetch(P + '/session')).json();
  if (!s.signedIn) { showSignIn(); return; }
  csrf = s.csrf; domain = s.domain || '';
  const so = document.getElementById('signout');
  so.hidden = false;
  if (s.operator) { showOperator(); return; }
  const m = location.pathname.match(/^\/console\/sandbox\/([^/]+)$/);
  if (m) showSandbox(decodeURIComponent(m[1])); else showList();
}

document.getElementById('signout').addEventListener('click', async () => { await call('DELETE', '/session'); showSignIn(); });
document.getElementById('home').addEventListener('click', (e) => { e.preventDefault(); history.pushState(null, '', P + '/'); route(); });
window.addEventListener('popstate', route);
route();
