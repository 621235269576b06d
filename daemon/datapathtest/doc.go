// Package datapathtest is an in-memory datapath for tests: the maps the
// reconciler writes, operation counts and logs, injected failures, a full
// map and a simulated crash. It implements daemon.Datapath, and Sockets
// daemon.SocketDatapath.
//
// Its files:
//
//   - datapath.go: Datapath, the steering maps (frontends, backend sets,
//     drain entries), the operation log (Op) and the failures and crash a
//     test injects;
//   - sockets.go: Sockets, the socket hooks' maps (connection counts a
//     test sets, gone peers and gone flows recorded).
//
// Each concept has one word, defined in the repository's docs/glossary.md.
package datapathtest
