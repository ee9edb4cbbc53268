package routes

import (
	"net"
	"net/http"
	"slices"
	"strings"
)

// Table is a parsed routes file: the routes, ordered for matching. It is immutable.
type Table struct {
	routes []*Route // most specific first: see sort
}

// Routes returns the table's routes, most specific first.
func (t *Table) Routes() []*Route { return slices.Clone(t.routes) }

// ByName returns the route named name, or nil.
func (t *Table) ByName(name string) *Route {
	for _, r := range t.routes {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// sort orders the routes so that the first one matching a request is the best: an exact
// host before a *.suffix (longer suffix first) before no host, then the longest path
// prefix, then a header match before none, then by name for a stable order.
func (t *Table) sort() {
	slices.SortStableFunc(t.routes, func(a, b *Route) int {
		if c := hostRank(b.Host) - hostRank(a.Host); c != 0 {
			return c
		}
		if c := len(b.PathPrefix) - len(a.PathPrefix); c != 0 {
			return c
		}
		if c := boolRank(b.HeaderName != "") - boolRank(a.HeaderName != ""); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
}

// hostRank grows with how specific a host pattern is.
func hostRank(h string) int {
	switch {
	case h == "":
		return 0
	case strings.HasPrefix(h, "*."):
		return 1 + len(h) // a longer suffix is more specific
	default:
		return 1 << 20
	}
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Match returns the best route for r, or nil.
func (t *Table) Match(r *http.Request) *Route {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, rt := range t.routes {
		if rt.matches(host, r.URL.Path, r.Header) {
			return rt
		}
	}
	return nil
}

// matches reports whether the route takes a request for host (lower case, no port),
// path and header.
func (rt *Route) matches(host, path string, h http.Header) bool {
	switch {
	case rt.Host == "":
	case strings.HasPrefix(rt.Host, "*."):
		if !strings.HasSuffix(host, rt.Host[1:]) {
			return false
		}
	default:
		if host != rt.Host {
			return false
		}
	}
	if !pathHasPrefix(path, rt.PathPrefix) {
		return false
	}
	if rt.HeaderName != "" && h.Get(rt.HeaderName) != rt.HeaderValue {
		return false
	}
	return true
}

// pathHasPrefix reports whether path begins with the segments of prefix.
func pathHasPrefix(path, prefix string) bool {
	if !strings.HasPrefix(path, prefix) {
		return false
	}
	return len(path) == len(prefix) || strings.HasSuffix(prefix, "/") || path[len(prefix)] == '/'
}
