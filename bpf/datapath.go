package bpf

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// DefaultPinDir is where draind pins its maps and links.
const DefaultPinDir = "/sys/fs/bpf/draind"

// abiVersion names the pinned map layout. Map adoption only checks sizes, so
// a change to a key or value layout must bump it: the new maps then live in a
// new directory, and the pins of older layouts are removed once the new
// programs are attached.
const abiVersion = "v1"

// MaxBackends is the largest selectable set of one service-port.
const MaxBackends = 1 << 16

// ErrMapFull is wrapped by updates that failed because a map is full.
var ErrMapFull = errors.New("bpf map full")

// MapName identifies one of the datapath's maps (for metrics and errors).
type MapName string

// The maps, as named in bpf/draind.h.
const (
	MapFrontends  MapName = "draind_frontends"
	MapServices   MapName = "draind_services"
	MapBackends   MapName = "draind_backends"
	MapDrains     MapName = "draind_drains"
	MapDrainStats MapName = "draind_drain_stats"
	MapCounters   MapName = "draind_counters"
	// MapUDPCounters counts unconnected datagrams by outcome.
	MapUDPCounters MapName = "draind_udp_counters"
	// MapUDPReverse holds the reverse translations of steered UDP (LRU).
	MapUDPReverse MapName = "draind_udp_reverse"
	// MapNode is the one-entry "something drains on this node" flag (and
	// "something is gone").
	MapNode MapName = "draind_node"
	// MapLocalConns counts passively established connections per local
	// pod address.
	MapLocalConns MapName = "draind_local_conns"
	// MapGonePeers holds the gone pod IPs whose client sockets end.
	MapGonePeers MapName = "draind_gone_peers"
	// MapGoneFlows holds client flows to a VIP that conntrack translated
	// to a gone pod.
	MapGoneFlows MapName = "draind_gone_flows"
	// MapSockCounters counts what the socket hooks did.
	MapSockCounters MapName = "draind_sock_counters"
	// MapSockInfo records when connection counting started.
	MapSockInfo MapName = "draind_sock_info"
)

// MapNames lists the maps in a fixed order. draind_udp_sockets and
// draind_sock_state (per-socket storage: it lives and dies with the sockets
// and cannot be enumerated) are not among them.
var MapNames = []MapName{MapFrontends, MapServices, MapBackends, MapDrains, MapDrainStats, MapCounters,
	MapUDPCounters, MapUDPReverse, MapNode, MapLocalConns, MapGonePeers, MapGoneFlows, MapSockCounters, MapSockInfo}

// laterMaps arrived after the first release: pins left by an older draind
// may lack them, and the read-only view (OpenPinned) does without.
var laterMaps = map[MapName]bool{MapUDPCounters: true, MapUDPReverse: true, MapNode: true,
	MapLocalConns: true, MapGonePeers: true, MapGoneFlows: true, MapSockCounters: true, MapSockInfo: true}

// Options configure Load.
type Options struct {
	// PinDir is a directory on a bpf filesystem; DefaultPinDir if empty.
	PinDir string
	// Sockets also loads and attaches the socket hooks: sock_ops (live
	// connections per pod address, ending TCP sockets to gone pods) and
	// cgroup_skb egress (ending connected UDP sockets to gone pods). Probe
	// says whether the kernel has what they need (Features.Sockets).
	Sockets bool
}

// Datapath is the loaded programs and their maps. Its methods are safe for
// concurrent use.
type Datapath struct {
	pinDir  string
	steer   steerObjects
	udp     udpObjects
	obs     observeObjects
	sockets bool // the socket hooks are loaded
	sock    sockopsObjects
	egr     egressObjects

	mu    sync.Mutex // serialises backend-set swaps and attachment
	links []namedLink

	// entries serialises every write to draind_frontends and draind_drains
	// (and to draind_gone_peers and draind_gone_flows) with the flags in
	// draind_node, so that a flag is never "idle" while an entry exists.
	entries struct {
		sync.Mutex
		frontends map[steerEpKey]struct{}
		drains    map[steerEpKey]struct{}
		draining  bool // what draind_node says
		gonePeers map[sockopsAddrKey]struct{}
		goneFlows map[sockopsFlowKey]struct{}
		gone      bool // what draind_node says
	}

	updateErrors map[MapName]*atomic.Uint64
}

// pinDirs makes the map directory of this ABI version under dir, which
// must be on a bpf filesystem, and returns it.
func pinDirs(dir string) (string, error) {
	mapDir := filepath.Join(dir, abiVersion)
	if err := os.MkdirAll(mapDir, 0o700); err != nil {
		return "", fmt.Errorf("creating pin directory: %w", err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return "", fmt.Errorf("checking pin directory %s: %w", dir, err)
	}
	if fs.Type != unix.BPF_FS_MAGIC {
		return "", fmt.Errorf("pin directory %s is not on a bpf filesystem (mount -t bpf bpf %s): %w",
			dir, filepath.Dir(dir), ebpf.ErrNotSupported)
	}
	return mapDir, nil
}

// Load loads the programs, adopting the pinned maps under opts.PinDir (or
// creating and pinning them). It does not attach anything.
func Load(opts Options) (*Datapath, error) {
	dir := opts.PinDir
	if dir == "" {
		dir = DefaultPinDir
	}
	mapDir, err := pinDirs(dir)
	if err != nil {
		return nil, err
	}
	d := &Datapath{pinDir: dir, updateErrors: map[MapName]*atomic.Uint64{}}
	for _, n := range MapNames {
		d.updateErrors[n] = new(atomic.Uint64)
	}
	copts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: mapDir}}

	spec, err := loadSteer()
	if err != nil {
		return nil, fmt.Errorf("loading steer spec: %w", err)
	}
	var n uint32
	if err := spec.Variables["draind_num_outcomes"].Get(&n); err != nil || int(n) != NumOutcomes {
		return nil, fmt.Errorf("steer object reports %d outcomes, Go expects %d (regenerate with go generate ./bpf/...): %v", n, NumOutcomes, err)
	}
	if err := setRetvalConst(spec); err != nil {
		return nil, err
	}
	if err := spec.LoadAndAssign(&d.steer, copts); err != nil {
		return nil, fmt.Errorf("loading connect hooks: %w", explainLoad(err, mapDir))
	}
	uspec, err := loadUdp()
	if err != nil {
		d.steer.Close()
		return nil, fmt.Errorf("loading udp spec: %w", err)
	}
	// Same pin path: the other objects adopt the maps steer just pinned.
	if err := errors.Join(setRetvalConst(uspec), uspec.LoadAndAssign(&d.udp, copts)); err != nil {
		d.steer.Close()
		return nil, fmt.Errorf("loading datagram hooks: %w", explainLoad(err, mapDir))
	}
	ospec, err := loadObserve()
	if err != nil {
		d.steer.Close()
		d.udp.Close()
		return nil, fmt.Errorf("loading observe spec: %w", err)
	}
	if err := ospec.LoadAndAssign(&d.obs, copts); err != nil {
		d.steer.Close()
		d.udp.Close()
		return nil, fmt.Errorf("loading SYN observer: %w", explainLoad(err, mapDir))
	}
	if opts.Sockets {
		if err := d.loadSockets(copts, mapDir); err != nil {
			d.steer.Close()
			d.udp.Close()
			d.obs.Close()
			return nil, err
		}
	}
	if err := d.adoptEntries(); err != nil {
		_ = d.closeObjects() // the load's own error is the one to report
		return nil, err
	}
	if !opts.Sockets {
		// Gone entries a draind with the socket hooks left would keep the
		// gone flag up, and the connect hooks looking, for nothing.
		if err := d.clearGone(); err != nil {
			_ = d.closeObjects() // the load's own error is the one to report
			return nil, err
		}
	}
	return d, nil
}

func (d *Datapath) closeObjects() error {
	errs := []error{d.steer.Close(), d.udp.Close(), d.obs.Close()}
	if d.sockets {
		errs = append(errs, d.sock.Close(), d.egr.Close())
	}
	return errors.Join(errs...)
}

// adoptEntries learns which frontend and drain entries the (possibly
// adopted) maps hold and writes the flag to match, before Attach puts
// programs that read it in place: maps pinned by a draind that predates the
// flag hold entries while the flag map, just created, says idle.
func (d *Datapath) adoptEntries() error {
	d.entries.Lock()
	defer d.entries.Unlock()
	var err error
	if d.entries.frontends, err = keysOf[steerEpKey](d.steer.DraindFrontends); err != nil {
		return fmt.Errorf("adopting frontends: %w", err)
	}
	if d.entries.drains, err = keysOf[steerEpKey](d.steer.DraindDrains); err != nil {
		return fmt.Errorf("adopting drains: %w", err)
	}
	if d.entries.gonePeers, err = keysOf[sockopsAddrKey](d.steer.DraindGonePeers); err != nil {
		return fmt.Errorf("adopting gone peers: %w", err)
	}
	if d.entries.goneFlows, err = keysOf[sockopsFlowKey](d.steer.DraindGoneFlows); err != nil {
		return fmt.Errorf("adopting gone flows: %w", err)
	}
	on := len(d.entries.frontends)+len(d.entries.drains) > 0
	gone := len(d.entries.gonePeers)+len(d.entries.goneFlows) > 0
	if err := d.writeFlags(on, gone); err != nil {
		return fmt.Errorf("adopting pinned maps: %w", err)
	}
	return nil
}

func keysOf[K comparable](m *ebpf.Map) (map[K]struct{}, error) {
	out := map[K]struct{}{}
	var k, next K
	var prev any // nil: the first key
	for {
		if err := m.NextKey(prev, &next); err != nil {
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				return out, nil
			}
			return nil, err
		}
		out[next] = struct{}{}
		k = next
		prev = &k
	}
}

// writeFlags sets draind_node. Callers hold d.entries.
func (d *Datapath) writeFlags(draining, gone bool) error {
	var v steerNodeState
	if draining {
		v.Draining = 1
	}
	if gone {
		v.Gone = 1
	}
	zero := uint32(0)
	if err := d.put(MapNode, d.steer.DraindNode, &zero, &v); err != nil {
		return err
	}
	d.entries.draining, d.entries.gone = draining, gone
	return nil
}

// writeDraining sets the draining flag, keeping the gone flag. Callers hold
// d.entries.
func (d *Datapath) writeDraining(on bool) error { return d.writeFlags(on, d.entries.gone) }

// beforeWrite raises the flag before an entry is written. Callers hold
// d.entries.
func (d *Datapath) beforeWrite() error {
	if d.entries.draining {
		return nil
	}
	return d.writeDraining(true)
}

// afterChange lowers the flag once neither map holds an entry. Callers hold
// d.entries. A failure leaves the flag raised: slower, never wrong.
func (d *Datapath) afterChange() error {
	if !d.entries.draining || len(d.entries.frontends)+len(d.entries.drains) > 0 {
		return nil
	}
	if err := d.writeDraining(false); err != nil {
		return fmt.Errorf("clearing the draining flag: %w", err)
	}
	return nil
}

type namedLink struct {
	name string
	link.Link
}

// attachment is one program and where it hooks.
type attachment struct {
	name string
	prog *ebpf.Program
	typ  ebpf.AttachType
}

func (d *Datapath) attachments() []attachment {
	out := []attachment{
		{"connect4", d.steer.DraindConnect4, ebpf.AttachCGroupInet4Connect},
		{"connect6", d.steer.DraindConnect6, ebpf.AttachCGroupInet6Connect},
		{"sendmsg4", d.udp.DraindSendmsg4, ebpf.AttachCGroupUDP4Sendmsg},
		{"sendmsg6", d.udp.DraindSendmsg6, ebpf.AttachCGroupUDP6Sendmsg},
		{"recvmsg4", d.udp.DraindRecvmsg4, ebpf.AttachCGroupUDP4Recvmsg},
		{"recvmsg6", d.udp.DraindRecvmsg6, ebpf.AttachCGroupUDP6Recvmsg},
		{"observe_ingress", d.obs.DraindObserve, ebpf.AttachCGroupInetIngress},
	}
	if d.sockets {
		out = append(out, d.socketAttachments()...)
	}
	return out
}

// Attach hooks the programs to the cgroup at path (the pods' cgroup) with
// pinned bpf_links. If a link is already pinned for that cgroup, its program
// is replaced in place, so there is no instant without a hook. A pinned link
// to another cgroup is detached.
func (d *Datapath) Attach(cgroupPath string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	cgID, err := CgroupID(cgroupPath)
	if err != nil {
		return fmt.Errorf("attaching to %s: %w", cgroupPath, err)
	}
	linkDir := filepath.Join(d.pinDir, "links")
	if err := os.MkdirAll(linkDir, 0o700); err != nil {
		return fmt.Errorf("creating link pin directory: %w", err)
	}
	for _, l := range d.links {
		l.Close()
	}
	d.links = nil
	if err := d.beforeAttach(); err != nil {
		return err
	}
	for _, a := range d.attachments() {
		l, err := d.attachOne(a, filepath.Join(linkDir, a.name), cgroupPath, cgID)
		if err != nil {
			return err
		}
		d.links = append(d.links, namedLink{a.name, l})
	}
	if err := d.afterAttach(linkDir); err != nil {
		return err
	}
	d.removeOldABIs()
	return nil
}

func (d *Datapath) attachOne(a attachment, pin, cgroupPath string, cgID uint64) (link.Link, error) {
	if old, err := link.LoadPinnedLink(pin, nil); err == nil {
		info, ierr := old.Info()
		if ierr == nil && info.Cgroup() != nil && info.Cgroup().CgroupId == cgID {
			if err := old.Update(a.prog); err != nil {
				old.Close()
				return nil, fmt.Errorf("replacing %s program on %s: %w", a.name, cgroupPath, err)
			}
			return old, nil
		}
		// Pinned for another cgroup (configuration changed): detach it.
		if err := old.Unpin(); err != nil {
			old.Close()
			return nil, fmt.Errorf("unpinning stale %s link: %w", a.name, err)
		}
		old.Close()
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("loading pinned %s link: %w", a.name, err)
	}
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: a.typ, Program: a.prog})
	if err != nil {
		return nil, fmt.Errorf("attaching %s to %s: %w", a.name, cgroupPath, err)
	}
	if err := l.Pin(pin); err != nil {
		l.Close()
		if errors.Is(err, ebpf.ErrNotSupported) {
			return nil, fmt.Errorf("pinning %s link (kernel lacks bpf_link for cgroups, Linux 5.7+): %w", a.name, err)
		}
		return nil, fmt.Errorf("pinning %s link: %w", a.name, err)
	}
	return l, nil
}

// removeOldABIs unpins maps of older layouts: the programs that used them
// were just replaced.
func (d *Datapath) removeOldABIs() {
	ents, err := os.ReadDir(d.pinDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), "v") && e.Name() != abiVersion {
			os.RemoveAll(filepath.Join(d.pinDir, e.Name()))
		}
	}
}

// Attached reports the names of the attached programs.
func (d *Datapath) Attached() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	names := make([]string, 0, len(d.links))
	for _, l := range d.links {
		names = append(names, l.name)
	}
	return names
}

// Close releases draind's handles. Pinned links and maps stay: steering goes
// on until the entries expire or a new draind adopts them.
func (d *Datapath) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	for _, l := range d.links {
		errs = append(errs, l.Close())
	}
	d.links = nil
	errs = append(errs, d.closeObjects())
	return errors.Join(errs...)
}

// Remove detaches the programs and deletes every pin under dir (uninstall).
func Remove(dir string) error {
	if dir == "" {
		dir = DefaultPinDir
	}
	var errs []error
	linkDir := filepath.Join(dir, "links")
	ents, err := os.ReadDir(linkDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("listing pinned links: %w", err))
	}
	for _, e := range ents {
		l, err := link.LoadPinnedLink(filepath.Join(linkDir, e.Name()), nil)
		if err != nil {
			errs = append(errs, fmt.Errorf("loading pinned link %s: %w", e.Name(), err))
			continue
		}
		errs = append(errs, l.Unpin(), l.Close())
	}
	// Remove only what draind created: the directory may be a bpffs root
	// with the kernel's own files in it.
	if err := os.Remove(linkDir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("removing the links directory: %w", err))
	}
	ents, err = os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("listing pinned maps: %w", err))
	}
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), "v") {
			if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
				errs = append(errs, fmt.Errorf("removing pinned maps: %w", err))
			}
		}
	}
	_ = os.Remove(dir) // fails harmlessly when dir is a mount point
	return errors.Join(errs...)
}

// --- encoding -------------------------------------------------------------

// addr16 is the map form of an address: IPv4 as v4-mapped IPv6.
func addr16(a netip.Addr) [16]byte { return a.As16() }

func decodeAddr(b [16]byte) netip.Addr {
	return netip.AddrFrom16(b).Unmap()
}

func encodeKey(k EndpointKey) steerEpKey {
	return steerEpKey{Addr: addr16(k.Addr), Port: k.Port, Proto: uint8(k.Proto)}
}

func decodeKey(k steerEpKey) EndpointKey {
	return EndpointKey{Addr: decodeAddr(k.Addr), Port: k.Port, Proto: Protocol(k.Proto)}
}

func (d *Datapath) put(name MapName, m *ebpf.Map, key, val any) error {
	if err := m.Put(key, val); err != nil {
		d.updateErrors[name].Add(1)
		if errors.Is(err, unix.E2BIG) || errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ENOMEM) {
			return fmt.Errorf("updating %s: %w: %w", name, ErrMapFull, err)
		}
		return fmt.Errorf("updating %s: %w", name, err)
	}
	return nil
}

func (d *Datapath) del(name MapName, m *ebpf.Map, key any) error {
	if err := m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		d.updateErrors[name].Add(1)
		return fmt.Errorf("deleting from %s: %w", name, err)
	}
	return nil
}

func validKey(k EndpointKey) error {
	if !k.Addr.IsValid() {
		return fmt.Errorf("invalid address in %v", k)
	}
	if k.Proto != TCP && k.Proto != UDP {
		return fmt.Errorf("unsupported protocol in %v", k)
	}
	return nil
}

// --- updates ----------------------------------------------------------------

// UpsertFrontend creates or replaces a frontend entry.
func (d *Datapath) UpsertFrontend(f Frontend) error {
	if err := validKey(f.Key); err != nil {
		return fmt.Errorf("upserting frontend: %w", err)
	}
	if f.Key.Port == 0 {
		return fmt.Errorf("upserting frontend %v: a frontend needs a port", f.Key)
	}
	v := steerFrontendVal{SvcId: uint32(f.Service), ExpiresNs: toBoot(f.Expires)}
	if f.NoSteer {
		v.Flags |= 1 // FRONTEND_NO_STEER
	}
	k := encodeKey(f.Key)
	return d.upsertEntry(MapFrontends, d.steer.DraindFrontends, d.entries.frontends, k, &v)
}

// DeleteFrontend removes a frontend entry (absent is fine).
func (d *Datapath) DeleteFrontend(k EndpointKey) error {
	d.entries.Lock()
	defer d.entries.Unlock()
	ek := encodeKey(k)
	if err := d.del(MapFrontends, d.steer.DraindFrontends, &ek); err != nil {
		return err
	}
	delete(d.entries.frontends, ek)
	return d.afterChange()
}

// upsertEntry writes a frontend or drain entry with the flag raised first.
// set is d.entries.frontends or d.entries.drains (maps are references).
func (d *Datapath) upsertEntry(name MapName, m *ebpf.Map, set map[steerEpKey]struct{}, k steerEpKey, v any) error {
	d.entries.Lock()
	defer d.entries.Unlock()
	if err := d.beforeWrite(); err != nil {
		return fmt.Errorf("raising the draining flag before writing %s: %w", name, err)
	}
	if err := d.put(name, m, &k, v); err != nil {
		// Nothing was written: drop the flag again if nothing else holds it.
		return errors.Join(err, d.afterChange())
	}
	set[k] = struct{}{}
	return nil
}

// UpsertDrain creates or replaces a draining endpoint entry.
func (d *Datapath) UpsertDrain(dr Drain) error {
	if err := validKey(dr.Key); err != nil {
		return fmt.Errorf("upserting drain: %w", err)
	}
	if dr.Policy > PolicyOff {
		return fmt.Errorf("upserting drain %v: %v", dr.Key, dr.Policy)
	}
	v := steerDrainVal{SvcId: uint32(dr.Service), Policy: uint8(dr.Policy), ExpiresNs: toBoot(dr.Expires)}
	k := encodeKey(dr.Key)
	return d.upsertEntry(MapDrains, d.steer.DraindDrains, d.entries.drains, k, &v)
}

// DeleteDrain removes a draining endpoint entry and its statistics.
func (d *Datapath) DeleteDrain(k EndpointKey) error {
	d.entries.Lock()
	defer d.entries.Unlock()
	ek := encodeKey(k)
	if err := d.del(MapDrains, d.steer.DraindDrains, &ek); err != nil {
		return err
	}
	delete(d.entries.drains, ek)
	return errors.Join(
		d.del(MapDrainStats, d.steer.DraindDrainStats, &ek),
		d.afterChange(),
	)
}

// SetBackends replaces the selectable set of a service-port atomically: the
// new set is written to the inactive generation, then one update of the
// service entry switches connect()s over, then the old generation is freed.
func (d *Datapath) SetBackends(b Backends) error {
	if b.Service == 0 {
		return errors.New("setting backends: service-port id 0 is reserved")
	}
	if len(b.Backends) > MaxBackends {
		return fmt.Errorf("setting backends of service-port %d: %d backends, at most %d", b.Service, len(b.Backends), MaxBackends)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	id := uint32(b.Service)
	var cur steerSvcVal
	exists := true
	if err := d.steer.DraindServices.Lookup(&id, &cur); err != nil {
		if !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("reading service-port %d: %w", id, err)
		}
		exists = false
	}
	gen := uint32(0)
	if exists {
		gen = (cur.Gen + 1) & 1
	}
	keys := make([]steerBackendKey, len(b.Backends))
	vals := make([]steerBackendVal, len(b.Backends))
	for i, ap := range b.Backends {
		if !ap.IsValid() || ap.Port() == 0 {
			return fmt.Errorf("setting backends of service-port %d: invalid backend %v", id, ap)
		}
		keys[i] = steerBackendKey{SvcId: id, Slot: uint16(i), Gen: uint8(gen)}
		vals[i] = steerBackendVal{Addr: addr16(ap.Addr()), Port: ap.Port()}
	}
	if err := d.putBackends(keys, vals); err != nil {
		// The live set is intact; nothing of the new one stays behind.
		return fmt.Errorf("setting backends of service-port %d: %w", id, errors.Join(err, d.deleteBackendSlots(keys)))
	}
	nv := steerSvcVal{Count: uint32(len(b.Backends)), Gen: gen, ExpiresNs: toBoot(b.Expires)}
	if err := d.put(MapServices, d.steer.DraindServices, &id, &nv); err != nil {
		return fmt.Errorf("setting backends of service-port %d: %w", id, errors.Join(err, d.deleteBackendSlots(keys)))
	}
	if exists {
		old := make([]steerBackendKey, cur.Count)
		for i := range old {
			old[i] = steerBackendKey{SvcId: id, Slot: uint16(i), Gen: uint8(cur.Gen & 1)}
		}
		if err := d.deleteBackendSlots(old); err != nil {
			return fmt.Errorf("freeing the old backends of service-port %d: %w", id, err)
		}
	}
	return nil
}

// putBackends writes backend slots with one batch update where the kernel
// has them (Linux 5.6), else one by one.
func (d *Datapath) putBackends(keys []steerBackendKey, vals []steerBackendVal) error {
	if len(keys) == 0 {
		return nil
	}
	_, err := d.steer.DraindBackends.BatchUpdate(keys, vals, nil)
	if errors.Is(err, ebpf.ErrNotSupported) {
		for i := range keys {
			if err := d.put(MapBackends, d.steer.DraindBackends, &keys[i], &vals[i]); err != nil {
				return err
			}
		}
		return nil
	}
	if err != nil {
		d.updateErrors[MapBackends].Add(1)
		if errors.Is(err, unix.E2BIG) || errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ENOMEM) {
			return fmt.Errorf("updating %s: %w: %w", MapBackends, ErrMapFull, err)
		}
		return fmt.Errorf("updating %s: %w", MapBackends, err)
	}
	return nil
}

// deleteBackendSlots deletes backend slots, absent ones included (a
// rollback does not know how far a failed write got).
func (d *Datapath) deleteBackendSlots(keys []steerBackendKey) error {
	var errs []error
	for i := range keys {
		errs = append(errs, d.del(MapBackends, d.steer.DraindBackends, &keys[i]))
	}
	return errors.Join(errs...)
}

// DeleteBackends removes a service-port and its backends.
func (d *Datapath) DeleteBackends(svc ServicePortID) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	id := uint32(svc)
	var cur steerSvcVal
	if err := d.steer.DraindServices.Lookup(&id, &cur); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil
		}
		return fmt.Errorf("reading service-port %d: %w", id, err)
	}
	if err := d.del(MapServices, d.steer.DraindServices, &id); err != nil {
		return err
	}
	for i := uint32(0); i < cur.Count; i++ {
		k := steerBackendKey{SvcId: id, Slot: uint16(i), Gen: uint8(cur.Gen & 1)}
		if err := d.del(MapBackends, d.steer.DraindBackends, &k); err != nil {
			return err
		}
	}
	return nil
}

// Prune deletes backend slots no service entry points at (left by a crash
// between writing a new generation and switching to it) and statistics of
// endpoints that no longer drain. Called after adopting pinned maps.
func (d *Datapath) Prune() (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	live := map[uint32]steerSvcVal{}
	var id uint32
	var sv steerSvcVal
	it := d.steer.DraindServices.Iterate()
	for it.Next(&id, &sv) {
		live[id] = sv
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("iterating services: %w", err)
	}
	var stale []steerBackendKey
	var bk steerBackendKey
	var bv steerBackendVal
	bit := d.steer.DraindBackends.Iterate()
	for bit.Next(&bk, &bv) {
		s, ok := live[bk.SvcId]
		if !ok || uint32(bk.Gen) != s.Gen&1 || uint32(bk.Slot) >= s.Count {
			stale = append(stale, bk)
		}
	}
	if err := bit.Err(); err != nil {
		return 0, fmt.Errorf("iterating backends: %w", err)
	}
	var staleStats []steerEpKey
	var ek steerEpKey
	var st steerDrainStats
	var dv steerDrainVal
	sit := d.steer.DraindDrainStats.Iterate()
	for sit.Next(&ek, &st) {
		if err := d.steer.DraindDrains.Lookup(&ek, &dv); errors.Is(err, ebpf.ErrKeyNotExist) {
			staleStats = append(staleStats, ek)
		}
	}
	if err := sit.Err(); err != nil {
		return 0, fmt.Errorf("iterating drain stats: %w", err)
	}
	for i := range stale {
		if err := d.del(MapBackends, d.steer.DraindBackends, &stale[i]); err != nil {
			return i, err
		}
	}
	for i := range staleStats {
		if err := d.del(MapDrainStats, d.steer.DraindDrainStats, &staleStats[i]); err != nil {
			return len(stale) + i, err
		}
	}
	return len(stale) + len(staleStats), nil
}

// --- reading ------------------------------------------------------------------

// Counters returns the outcome counters of connect()s (and SYNs), summed
// over CPUs.
func (d *Datapath) Counters() (Counters, error) {
	return readCounters(d.steer.DraindCounters)
}

func readCounters(m *ebpf.Map) (Counters, error) {
	var c Counters
	var percpu []uint64
	for o := 0; o < NumOutcomes; o++ {
		for f := 0; f < 2; f++ {
			idx := uint32(o*2 + f)
			if err := m.Lookup(&idx, &percpu); err != nil {
				return c, fmt.Errorf("reading counter %d: %w", idx, err)
			}
			for _, v := range percpu {
				c[o][f] += v
			}
		}
	}
	return c, nil
}

// DrainStats returns the statistics of one draining endpoint (zero if none).
func (d *Datapath) DrainStats(k EndpointKey) (DrainStats, error) {
	ek := encodeKey(k)
	var st steerDrainStats
	if err := d.steer.DraindDrainStats.Lookup(&ek, &st); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return DrainStats{}, nil
		}
		return DrainStats{}, fmt.Errorf("reading stats of %v: %w", k, err)
	}
	return decodeStats(st), nil
}

func decodeStats(st steerDrainStats) DrainStats {
	out := DrainStats{SYNs: st.Syns, Steered: st.Steered, Refused: st.Refused, Passed: st.Passed}
	if st.LastSynNs != 0 {
		out.LastSYN = fromBoot(st.LastSynNs)
	}
	return out
}

// MapStat is the fill level of one map.
type MapStat struct {
	Name         MapName
	Entries      int
	Capacity     int
	UpdateErrors uint64
	// FullIsNormal marks maps for which being at capacity is no problem:
	// arrays always are, LRU maps make room by dropping their oldest entry.
	FullIsNormal bool `json:",omitempty"`
}

// MapStats counts the entries of every map. It walks the keys, which is
// cheap for maps that only hold what currently drains.
func (d *Datapath) MapStats() ([]MapStat, error) {
	return mapStats(d.maps(), d.updateErrors)
}

func (d *Datapath) maps() map[MapName]*ebpf.Map {
	return map[MapName]*ebpf.Map{
		MapFrontends: d.steer.DraindFrontends, MapServices: d.steer.DraindServices,
		MapBackends: d.steer.DraindBackends, MapDrains: d.steer.DraindDrains,
		MapDrainStats: d.steer.DraindDrainStats, MapCounters: d.steer.DraindCounters,
		MapUDPCounters: d.steer.DraindUdpCounters, MapUDPReverse: d.steer.DraindUdpReverse,
		MapNode: d.steer.DraindNode, MapLocalConns: d.steer.DraindLocalConns,
		MapGonePeers: d.steer.DraindGonePeers, MapGoneFlows: d.steer.DraindGoneFlows,
		MapSockCounters: d.steer.DraindSockCounters, MapSockInfo: d.steer.DraindSockInfo,
	}
}

func mapStats(maps map[MapName]*ebpf.Map, errs map[MapName]*atomic.Uint64) ([]MapStat, error) {
	out := make([]MapStat, 0, len(MapNames))
	for _, n := range MapNames {
		m := maps[n]
		if m == nil { // a later map an older draind did not pin
			continue
		}
		st := MapStat{Name: n, Capacity: int(m.MaxEntries())}
		if errs != nil {
			st.UpdateErrors = errs[n].Load()
		}
		switch m.Type() {
		case ebpf.PerCPUArray, ebpf.Array:
			st.Entries = st.Capacity
			st.FullIsNormal = true
		case ebpf.LRUHash:
			st.FullIsNormal = true
			cnt, err := countReverse(m)
			if err != nil {
				return nil, fmt.Errorf("counting %s: %w", n, err)
			}
			st.Entries = cnt
		default:
			k := make([]byte, m.KeySize())
			it := m.Iterate()
			v := make([]byte, m.ValueSize())
			for it.Next(&k, &v) {
				st.Entries++
			}
			if err := it.Err(); err != nil {
				return nil, fmt.Errorf("counting %s: %w", n, err)
			}
		}
		out = append(out, st)
	}
	return out, nil
}

// countReverse counts the reverse translations in batches: the map is large
// and full most of the time, and metrics read it on every scrape.
func countReverse(m *ebpf.Map) (int, error) {
	const batch = 4096
	keys := make([]steerUdpRevKey, batch)
	vals := make([]steerBackendVal, batch)
	var cursor ebpf.MapBatchCursor
	total := 0
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		total += n
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return total, nil
		}
		if errors.Is(err, ebpf.ErrNotSupported) {
			return iterateCount(m)
		}
		if err != nil {
			return 0, err
		}
	}
}

func iterateCount(m *ebpf.Map) (int, error) {
	var k steerUdpRevKey
	var v steerBackendVal
	n := 0
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	return n, it.Err()
}

// Dump reads every map, sorted.
func (d *Datapath) Dump() (*Dump, error) {
	return dumpMaps(d.maps())
}

func dumpMaps(m map[MapName]*ebpf.Map) (*Dump, error) {
	out := &Dump{Stats: map[EndpointKey]DrainStats{}}
	var ek steerEpKey
	var fv steerFrontendVal
	it := m[MapFrontends].Iterate()
	for it.Next(&ek, &fv) {
		out.Frontends = append(out.Frontends, Frontend{Key: decodeKey(ek), Service: ServicePortID(fv.SvcId),
			NoSteer: fv.Flags&1 != 0, Expires: fromBoot(fv.ExpiresNs)})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("dumping frontends: %w", err)
	}
	var dv steerDrainVal
	it = m[MapDrains].Iterate()
	for it.Next(&ek, &dv) {
		out.Drains = append(out.Drains, Drain{Key: decodeKey(ek), Service: ServicePortID(dv.SvcId),
			Policy: Policy(dv.Policy), Expires: fromBoot(dv.ExpiresNs)})
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("dumping drains: %w", err)
	}
	var st steerDrainStats
	it = m[MapDrainStats].Iterate()
	for it.Next(&ek, &st) {
		out.Stats[decodeKey(ek)] = decodeStats(st)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("dumping drain stats: %w", err)
	}
	svcs := map[uint32]steerSvcVal{}
	var id uint32
	var sv steerSvcVal
	it = m[MapServices].Iterate()
	for it.Next(&id, &sv) {
		svcs[id] = sv
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("dumping services: %w", err)
	}
	for id, sv := range svcs {
		b, ok, err := dumpBackends(m, id, sv)
		if err != nil {
			return nil, err
		}
		if ok {
			out.Backends = append(out.Backends, b)
		}
	}
	c, err := readCounters(m[MapCounters])
	if err != nil {
		return nil, err
	}
	out.Counters = c
	if m[MapUDPCounters] != nil {
		if out.DatagramCounters, err = readCounters(m[MapUDPCounters]); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(out.Frontends, func(a, b Frontend) int { return a.Key.Compare(b.Key) })
	slices.SortFunc(out.Drains, func(a, b Drain) int { return a.Key.Compare(b.Key) })
	sort.Slice(out.Backends, func(i, j int) bool { return out.Backends[i].Service < out.Backends[j].Service })
	return out, nil
}

// dumpRetries bounds how often dumpBackends starts a service-port over
// because the daemon replaced its set while it was read. It waits twice as
// long before each (dumpBackoff, from 100 µs up to 10 ms, about 50 ms in
// all): the daemon replaces a set a few times a second at most, and a read
// that a loaded machine preempted mid-way is tried again after the burst.
const dumpRetries = 12

// dumpBackoff is the wait before read try (from 1) of a service-port.
func dumpBackoff(try int) time.Duration {
	return min(100*time.Microsecond<<(try-1), 10*time.Millisecond)
}

// dumpBackends reads the live backend set of service-port id, whose entry
// read sv. A dump holds no lock against the daemon (`draind bpf dump` is
// another process): between reading the entry and its slots the daemon may
// switch the service-port to a new generation and free the old slots, or
// delete it. A set counts as read when every slot was there and the entry
// is the same after reading them as before; otherwise, after a short wait,
// it is read again from the entry as it is then. ok is false when the
// service-port was deleted.
func dumpBackends(m map[MapName]*ebpf.Map, id uint32, sv steerSvcVal) (b Backends, ok bool, err error) {
	entry := func() (steerSvcVal, bool, error) {
		var v steerSvcVal
		err := m[MapServices].Lookup(&id, &v)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return v, false, nil
		}
		if err != nil {
			return v, false, fmt.Errorf("dumping service-port %d: %w", id, err)
		}
		return v, true, nil
	}
	for try := range dumpRetries {
		if try > 0 {
			time.Sleep(dumpBackoff(try))
			if sv, ok, err = entry(); !ok {
				return Backends{}, false, err
			}
		}
		b = Backends{Service: ServicePortID(id), Expires: fromBoot(sv.ExpiresNs)}
		whole := true
		for i := uint32(0); i < sv.Count; i++ {
			k := steerBackendKey{SvcId: id, Slot: uint16(i), Gen: uint8(sv.Gen & 1)}
			var bv steerBackendVal
			if err := m[MapBackends].Lookup(&k, &bv); errors.Is(err, ebpf.ErrKeyNotExist) {
				whole = false
				break
			} else if err != nil {
				return Backends{}, false, fmt.Errorf("dumping backend %d of service-port %d: %w", i, id, err)
			}
			b.Backends = append(b.Backends, netip.AddrPortFrom(decodeAddr(bv.Addr), bv.Port))
		}
		now, ok, err := entry()
		if !ok {
			return Backends{}, false, err
		}
		if whole && now == sv {
			return b, true, nil
		}
	}
	return Backends{}, false, fmt.Errorf("dumping service-port %d: %d reads in a row found a slot missing or the set replaced", id, dumpRetries)
}

// Pinned is read-only access to pinned maps, without loading programs: what
// `draind bpf dump` uses, so it works while the daemon is down.
type Pinned struct {
	maps map[MapName]*ebpf.Map
}

// OpenPinned opens the maps pinned under dir.
func OpenPinned(dir string) (*Pinned, error) {
	if dir == "" {
		dir = DefaultPinDir
	}
	p := &Pinned{maps: map[MapName]*ebpf.Map{}}
	for _, n := range MapNames {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, abiVersion, string(n)), &ebpf.LoadPinOptions{ReadOnly: true})
		if laterMaps[n] && errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("opening pinned map %s under %s: %w", n, dir, err)
		}
		p.maps[n] = m
	}
	return p, nil
}

// Dump reads every map, sorted.
func (p *Pinned) Dump() (*Dump, error) { return dumpMaps(p.maps) }

// Close releases the maps.
func (p *Pinned) Close() error {
	var errs []error
	for _, m := range p.maps {
		errs = append(errs, m.Close())
	}
	return errors.Join(errs...)
}
