// Package nodeapi is draind's node-local HTTP API — POST /v1/offline, POST
// /v1/online, /healthz, /readyz — and the limits every HTTP listener of
// draind has. It knows nothing of how a drain is done: it needs only the
// Drains interface (see docs/prestop.md for the API, docs/glossary.md for
// its words).
//
// Its files:
//
//   - api.go: Server, the API's handler (Result, Drains, Config);
//   - query.go: parsing and bounding /v1/offline's query (wait, quiet);
//   - limits.go: the limits of every HTTP listener of draind
//     (BoundedServer's timeouts and caps, CapListener's connection cap).
package nodeapi
