// Package wiretest connects the tests of the gRPC fronts (src/service,
// src/rlqs) to a server in memory, without a listener.
package wiretest

import (
	"bytes"
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/encoding/protowire"
)

// Client serves srv on an in-memory listener for the length of the test
// and returns a client connection to it.
func Client(t testing.TB, srv *grpc.Server) *grpc.ClientConn {
	t.Helper()
	ln := bufconn.Listen(1 << 20)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///bufconn",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// Raw is a client codec (grpc.ForceCodec) that sends a *[]byte as it is
// and reads a reply into one, so that a test can send what a hostile
// client would: bytes no proto library would encode.
type Raw struct{}

func (Raw) Marshal(v any) ([]byte, error)      { return *v.(*[]byte), nil }
func (Raw) Unmarshal(data []byte, v any) error { *v.(*[]byte) = data; return nil }
func (Raw) Name() string                       { return "proto" }

// Field encodes a length-delimited field numbered num holding the parts
// one after the other, with no check of their content (such as the UTF-8
// check a proto library does): a test builds hostile messages of these.
func Field(num protowire.Number, parts ...[]byte) []byte {
	b := protowire.AppendTag(nil, num, protowire.BytesType)
	return protowire.AppendBytes(b, bytes.Join(parts, nil))
}
