package server

import "net"

// Addrs are the addresses the server listens on (useful with port 0).
type Addrs struct{ GRPC, HTTP, Debug net.Addr }

// Addrs returns the listeners' addresses.
func (s *Server) Addrs() Addrs {
	return Addrs{GRPC: s.grpcLn.Addr(), HTTP: s.httpLn.Addr(), Debug: s.debugLn.Addr()}
}

// Health returns the server's health state.
func (s *Server) Health() *Health { return s.health }
