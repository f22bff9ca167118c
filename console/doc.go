// Package console is hutch serve's web console: pages a browser signs in
// to with a tenant's API key, and the same-origin paths those pages call.
//
// It owns the console's sessions (server-side, in a cookie that is
// HttpOnly and SameSite=Strict, with a CSRF token for every call that is
// not a GET), its Content-Security-Policy, and its embedded assets
// (console/web, built into console/dist). It must not do anything the
// session's key could not: every call the pages make is passed, in
// process, to serve's own handler with that key (/console/api/...) or
// with the sandbox's envd access token that key obtains
// (/console/envd/ID/...), never past it. It imports nothing of serve:
// serve mounts it (serve.Server.SetConsole) and it calls serve back
// through the http.Handler it is given.
package console
