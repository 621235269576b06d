package daemon

// Helpers only tests need, kept out of the production package.

// openConnections is how many connections the offline API holds open.
func (d *Daemon) openConnections() int { return d.api.OpenConnections() }
