package k8s

import "testing"

func TestProgressRoundTripAndOldFormat(t *testing.T) {
	p := Progress{SYNs: 12, SYNsLast10s: 3, HasLast10s: true, Live: 2, Steered: 40}
	s := p.String()
	if s != "syns=12 live=2 steered=40 syns_10s=3" {
		t.Errorf("String() = %q", s)
	}
	got, err := ParseProgress(s)
	if err != nil || got != p {
		t.Errorf("ParseProgress(%q) = %+v, %v; want %+v", s, got, err, p)
	}
	// The older format (FormatProgress) still parses, without the window.
	old, err := ParseProgress(FormatProgress(5, 1, 9))
	if err != nil || old != (Progress{SYNs: 5, Live: 1, Steered: 9}) {
		t.Errorf("old format: %+v, %v", old, err)
	}
	if (Progress{SYNs: 5, Live: 1, Steered: 9}).String() != FormatProgress(5, 1, 9) {
		t.Error("a Progress without the window must render as FormatProgress")
	}
	// Unknown keys from newer writers are ignored; garbage is an error.
	if p, err := ParseProgress("syns=1 future=x live=0 steered=0"); err != nil || p.SYNs != 1 {
		t.Errorf("unknown key: %+v, %v", p, err)
	}
	for _, bad := range []string{"syns=x", "live", "syns_10s=-1"} {
		if _, err := ParseProgress(bad); err == nil {
			t.Errorf("ParseProgress(%q) accepted", bad)
		}
	}
}
