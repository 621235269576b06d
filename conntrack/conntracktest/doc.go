// Package conntracktest is an in-memory conntrack table for tests: Fake
// holds flows, expires and counts them by exactly the rules the netlink
// handle applies (conntrack.FilterSet and conntrack.CountedFor, not a copy
// of them), records every call so a test can assert how many operations a
// reconcile cost, and fails calls on demand. It implements
// conntrack.Interface and conntrack.FlowLister.
//
// Its files:
//
//   - fake.go: Fake, its table, the calls it recorded, the zone it acts
//     in, the timestamps it reports and the failures a test injects.
//
// Each concept has one word, defined in the repository's docs/glossary.md.
package conntracktest
