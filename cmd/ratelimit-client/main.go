// Command ratelimit-client sends one ShouldRateLimit request and prints the
// answer, like envoyproxy/ratelimit's client:
//
//	ratelimit-client -dial_string 127.0.0.1:8081 -domain web -descriptors user=alice,path=/login
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
)

// parseDescriptor reads "key=value,key2=value2" into one descriptor.
func parseDescriptor(v string) (*ratelimitv3.RateLimitDescriptor, error) {
	desc := &ratelimitv3.RateLimitDescriptor{}
	for _, pair := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(pair, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("descriptor entry %q is not key=value", pair)
		}
		desc.Entries = append(desc.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: k, Value: val})
	}
	return desc, nil
}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "ratelimit-client:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("ratelimit-client", flag.ContinueOnError)
	addr := fs.String("dial_string", "127.0.0.1:8081", "gRPC address of the service")
	domain := fs.String("domain", "", "rate limit domain")
	hits := fs.Uint("hits_addend", 0, "hits to add (0 means 1)")
	timeout := fs.Duration("timeout", 5*time.Second, "call timeout")
	var descs []*ratelimitv3.RateLimitDescriptor
	fs.Func("descriptors", "a descriptor as key=value[,key=value...]; repeat for several", func(v string) error {
		d, err := parseDescriptor(v)
		if err == nil {
			descs = append(descs, d)
		}
		return err
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *domain == "" || len(descs) == 0 {
		return errors.New("need -domain and at least one -descriptors")
	}
	cc, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	resp, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain: *domain, Descriptors: descs, HitsAddend: uint32(*hits),
	})
	if err != nil {
		return err
	}
	b, err := protojson.MarshalOptions{Multiline: true}.Marshal(resp)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(out, string(b))
	return err
}
