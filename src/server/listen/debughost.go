package listen

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// AllowHosts answers only the requests whose Host header names this
// machine's debug listener as its operator reaches it: none (a client
// that sends no Host), localhost, an address (IPv4 or IPv6, any: the
// listener's own address when DEBUG_HOST publishes it), or one of names
// (DEBUG_ALLOWED_HOSTS; "*" lets every Host through). Others get 403.
//
// The check closes DNS rebinding (issue 24, case 9): a web page the
// operator opens while the debug port is reachable on 127.0.0.1 (a
// kubectl port-forward) can make its own name resolve to 127.0.0.1 and
// then read, as its own origin, the live view's request values, the rules
// and pprof. The browser still sends that name in Host, and a page cannot
// set Host itself; an address in Host never comes from a rebinding, since
// the page's origin would then be the address itself.
func AllowHosts(names []string, next http.Handler) http.Handler {
	allowed := map[string]bool{"localhost": true}
	for _, n := range names {
		n = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(n)), ".")
		if n == "*" {
			return next
		}
		if n != "" {
			allowed[n] = true
		}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hostAllowed(r.Host, allowed) {
			w.Header().Set("X-Content-Type-Options", "nosniff")
			http.Error(w, "debug listener: this Host is not allowed: use localhost or an address, or list the name in DEBUG_ALLOWED_HOSTS", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// hostAllowed reports whether a Host header (host, or host:port) is
// empty, an address, or one of allowed's names.
func hostAllowed(host string, allowed map[string]bool) bool {
	if host == "" {
		return true
	}
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	return allowed[host]
}
