package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// Twemproxy is a nutcracker (twemproxy) process on a free 127.0.0.1 port,
// sharding keys over Redis servers: the anchor's default deployment.
type Twemproxy struct {
	// Addr is "127.0.0.1:port" of the proxy.
	Addr string
	// Dir holds the configuration and the log.
	Dir string

	statsPort int
	proc      proc
}

// StartTwemproxy starts nutcracker in front of backends for the test and
// stops it in t.Cleanup. The test fails when the binary is missing.
func StartTwemproxy(tb testing.TB, backends ...*RedisServer) *Twemproxy {
	tb.Helper()
	return startFor(tb, func(dir string) (*Twemproxy, error) { return LaunchTwemproxy(dir, backends) })
}

// LaunchTwemproxy starts nutcracker in front of backends (plain TCP, no
// auth: twemproxy speaks neither TLS nor ACLs) and waits until a PING through
// it answers. The caller must call Close.
func LaunchTwemproxy(dir string, backends []*RedisServer) (*Twemproxy, error) {
	bin, err := nutcrackerPath()
	if err != nil {
		return nil, err
	}
	if len(backends) == 0 {
		return nil, errors.New("harness: twemproxy needs at least one Redis server")
	}
	return launchOnFreePort(func(port int) (*Twemproxy, error) {
		statsPort, err := freePort()
		if err != nil {
			return nil, err
		}
		return &Twemproxy{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), Dir: dir, statsPort: statsPort}, nil
	}, func(p *Twemproxy) error { return p.start(bin, backends) })
}

// nutcrackerPath finds the binary; Debian installs it in /usr/sbin, which
// a user's PATH may lack.
func nutcrackerPath() (string, error) {
	if p, err := exec.LookPath("nutcracker"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/nutcracker"); err == nil {
		return "/usr/sbin/nutcracker", nil
	}
	return "", errors.New("harness: nutcracker (twemproxy) not found: run `make servers` (apt-get install nutcracker; brew install twemproxy)")
}

func (p *Twemproxy) start(bin string, backends []*RedisServer) error {
	var conf strings.Builder
	// One connection per backend (the default) keeps the order of a
	// client's pipeline; timeout bounds a server that stopped answering.
	fmt.Fprintf(&conf, "ratelimit:\n  listen: %s\n  hash: fnv1a_64\n  distribution: ketama\n  redis: true\n"+
		"  auto_eject_hosts: false\n  timeout: 2000\n  servers:\n", p.Addr)
	for i, b := range backends {
		fmt.Fprintf(&conf, "   - %s:1 redis%d\n", b.Addr, i)
	}
	path := filepath.Join(p.Dir, fmt.Sprintf("twemproxy-%d.yml", p.statsPort))
	if err := os.WriteFile(path, []byte(conf.String()), 0o600); err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	// nutcracker writes its log itself (-o); its stdout is not kept.
	log := filepath.Join(p.Dir, fmt.Sprintf("twemproxy-%d.log", p.statsPort))
	cmd := exec.Command(bin, "-c", path, "-a", "127.0.0.1", "-s", strconv.Itoa(p.statsPort), "-o", log)
	return p.proc.start(cmd, procSpec{
		name: "nutcracker",
		addr: p.Addr,
		ready: func(ctx context.Context, _ int) error {
			reply, err := redisDo(ctx, p.Addr, nil, "", "", "PING")
			if err == nil && reply != "PONG" {
				err = fmt.Errorf("PING answered with %v", reply)
			}
			return err
		},
		tail: func() string { return fileTail(log) },
	})
}

// Close stops the proxy. It is safe to call more than once.
func (p *Twemproxy) Close() error {
	p.proc.stop()
	return nil
}
