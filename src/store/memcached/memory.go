package memcached

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Memory is what a memcached server says of its memory cap and eviction
// (stats settings; issue 24, case 2): with evictions on, its default,
// memcached drops the least recently used items when memory runs short,
// whether they have expired or not, and a client over its limit whose
// counter goes starts afresh.
type Memory struct {
	// Server is the server's address.
	Server string
	// Known is false when the server did not answer stats settings.
	Known bool
	// MaxBytes is its memory cap (-m).
	MaxBytes int64
	// Evictions is whether it evicts items to store new ones (-M turns
	// it off: memcached then refuses the write, "SERVER_ERROR out of
	// memory storing object").
	Evictions bool
}

// Evicts reports whether the server may drop items before they expire.
func (m Memory) Evicts() bool { return m.Known && m.Evictions }

// maxStatsLines bounds the lines of a stats settings answer read (about
// 70 in memcached 1.6).
const maxStatsLines = 512

// Memory asks every server for its memory cap and eviction setting, on a
// connection of its own (dialed as the store's, TLS included), each within
// the store's timeout. A server that does not answer is not Known.
func (s *Store) Memory(ctx context.Context) []Memory {
	addrs := s.client.Addrs()
	out := make([]Memory, len(addrs))
	for i, addr := range addrs {
		out[i] = Memory{Server: addr}
		if m, err := s.readMemory(ctx, addr); err == nil {
			out[i] = m
		}
	}
	return out
}

func (s *Store) readMemory(ctx context.Context, addr string) (Memory, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	conn, err := s.dial(ctx, "tcp", addr)
	if err != nil {
		return Memory{}, err
	}
	defer conn.Close()
	deadline, _ := ctx.Deadline()
	_ = conn.SetDeadline(deadline)
	if _, err := conn.Write([]byte("stats settings\r\n")); err != nil {
		return Memory{}, err
	}
	m := Memory{Server: addr}
	var maxOK, evOK bool
	r := bufio.NewReaderSize(conn, 4096)
	for range maxStatsLines {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return Memory{}, err
		}
		f := strings.Fields(string(line))
		switch {
		case len(f) == 1 && f[0] == "END":
			if !maxOK || !evOK {
				return Memory{}, errors.New("memcached: stats settings: no maxbytes or evictions")
			}
			m.Known = true
			return m, nil
		case len(f) != 3 || f[0] != "STAT":
			return Memory{}, fmt.Errorf("memcached: stats settings: unexpected line %q", line)
		case f[1] == "maxbytes":
			m.MaxBytes, err = strconv.ParseInt(f[2], 10, 64)
			maxOK = err == nil
		case f[1] == "evictions":
			m.Evictions, evOK = f[2] == "on", true
		}
	}
	return Memory{}, fmt.Errorf("memcached: stats settings: over %d lines", maxStatsLines)
}
