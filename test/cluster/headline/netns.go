package headline

import (
	"context"
	"net"
)

// netnsDialer dials from inside a network namespace (each dial runs on a
// thread switched into it; the socket stays there).
type netnsDialer struct {
	do func(func() error) error
}

func (d netnsDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := d.do(func() (err error) {
		c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
		return err
	})
	return c, err
}
