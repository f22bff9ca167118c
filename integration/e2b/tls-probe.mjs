// One request with Node's own fetch, as a user's program makes it:
// prints {"status", "body"} or {"error": CODE, "message"} as JSON, where
// CODE is the TLS or network error Node reports (ERR_TLS_CERT_ALTNAME_INVALID,
// CERT_HAS_EXPIRED, ...). Usage: node tls-probe.mjs URL

const url = process.argv[2]
try {
  const r = await fetch(url, { signal: AbortSignal.timeout(10_000) })
  console.log(JSON.stringify({ status: r.status, body: (await r.text()).slice(0, 300) }))
} catch (err) {
  const cause = err.cause ?? err
  console.log(JSON.stringify({ error: cause.code ?? cause.name, message: String(cause.message ?? cause) }))
}
