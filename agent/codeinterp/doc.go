// Package codeinterp holds the code interpreter's server, which runs
// inside sandboxes of the code-interpreter-v1 template: not Go, but the
// files `make code-interpreter-image` copies into the image under
// /usr/local/lib/hutch/codeinterp.
//
//   - server.py speaks E2B's code-interpreter protocol on port 49999
//     (POST /execute, the /contexts calls, GET /health) and runs each
//     context: an IPython kernel through jupyter_client for Python, a
//     jsctx.mjs process for JavaScript and TypeScript, a bash process
//     for bash (docs/decisions/0046-code-interpreter-contexts.md).
//   - jsctx.mjs runs one JavaScript or TypeScript context in a node:vm
//     context.
//   - startup.py, run by every IPython kernel at start, adds E2B's
//     e2b/data (DataFrames) and e2b/chart (matplotlib figures) formats;
//     hutch_charts.py turns a figure into E2B's chart object.
//
// Nothing here imports the host side; the host knows the server only by
// its port and protocol (client.Code).
package codeinterp
