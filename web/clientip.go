package web

import (
	"net/http"
	"net/netip"
	"strings"
)

// Who the client is, and whether it may talk to the gateway at all.
//
//	X-Forwarded-For: client, proxy1, proxy2     believed only from a peer in TrustedProxies
//	403 {"error":"client 203.0.113.9 is not in allowed_networks"}
//
// The client of a request is its peer address, unless the peer is a trusted
// proxy: then it is the rightmost address of X-Forwarded-For (every such
// header, in order) that is not a trusted proxy itself, so a client cannot
// pick its own address by sending the header (a trusted proxy appends what
// it saw). When every address is trusted, the client is the leftmost one; an
// entry that is not an address stops the walk at the last trusted hop.
// Limits, logs and AllowedNetworks all see this client.

// peerIP is the address the connection comes from.
func peerIP(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

func inPrefixes(ip netip.Addr, ps []netip.Prefix) bool {
	for _, p := range ps {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// clientIP is the client the limits apply to (see above).
func (s *Server) clientIP(r *http.Request) netip.Addr {
	peer := peerIP(r)
	trusted := s.cfg.TrustedProxies
	if len(trusted) == 0 || !inPrefixes(peer, trusted) {
		return peer
	}
	return forwardedClient(peer, r.Header.Values("X-Forwarded-For"), trusted)
}

// forwardedClient walks X-Forwarded-For from the right, past trusted hops.
func forwardedClient(peer netip.Addr, headers []string, trusted []netip.Prefix) netip.Addr {
	client := peer
	for i := len(headers) - 1; i >= 0; i-- {
		h := headers[i]
		for h != "" {
			var part string
			if j := strings.LastIndexByte(h, ','); j >= 0 {
				part, h = h[j+1:], h[:j]
			} else {
				part, h = h, ""
			}
			part = strings.TrimSpace(part)
			if part == "" {
				continue
			}
			ip, err := netip.ParseAddr(strings.Trim(part, "[]"))
			if err != nil {
				ap, perr := netip.ParseAddrPort(part) // "192.0.2.7:4711", "[2001:db8::7]:4711"
				if perr != nil {
					return client
				}
				ip = ap.Addr()
			}
			client = ip.Unmap().WithZone("")
			if !inPrefixes(client, trusted) {
				return client
			}
		}
	}
	return client
}

// allowedClient reports whether ip may use the gateway (AllowedNetworks
// empty: everyone).
func (s *Server) allowedClient(ip netip.Addr) bool {
	return len(s.cfg.AllowedNetworks) == 0 || inPrefixes(ip, s.cfg.AllowedNetworks)
}
