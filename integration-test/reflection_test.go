package integration

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
)

// listServices asks p's gRPC listener for its services through server
// reflection.
func listServices(t *testing.T, p *proc) ([]string, error) {
	t.Helper()
	cc, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	stream, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(callCtx(t))
	if err != nil {
		return nil, err
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		return nil, err
	}
	rr, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, s := range rr.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	return names, nil
}

// TestReflectionCanBeTurnedOff: server reflection answers by default, as
// the anchor's does, and GRPC_REFLECTION_ENABLED=false turns it off
// (issue 24, case 10): a call to it is Unimplemented, and rate-limit calls
// are served as before.
func TestReflectionCanBeTurnedOff(t *testing.T) {
	on := start(t, map[string]string{"web.yaml": webRules})
	if names, err := listServices(t, on); err != nil || len(names) == 0 {
		t.Errorf("reflection by default: %v, %v; want the services listed", names, err)
	}
	off := start(t, map[string]string{"web.yaml": webRules}, "GRPC_REFLECTION_ENABLED=false")
	if names, err := listServices(t, off); status.Code(err) != codes.Unimplemented {
		t.Errorf("reflection with GRPC_REFLECTION_ENABLED=false: %v, %v; want Unimplemented", names, err)
	}
	if _, err := off.client(t).ShouldRateLimit(callCtx(t), request("web", "user", "a")); err != nil {
		t.Errorf("a rate-limit call without reflection: %v", err)
	}
}
