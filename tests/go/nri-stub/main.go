// nri-stub is NRI's reference plugin shape at its cheapest: a plugin built on the published
// github.com/containerd/nri module's pkg/stub that answers every event at once with no
// adjustment, so that bench/nri.py can measure what containerd's round trips to any external
// NRI plugin cost, apart from what nvshim's agent does.
//
// Usage: nri-stub SOCKET INDEX EVENTS
//
// EVENTS is "create" (CreateContainer only) or "same" (CreateContainer, StartContainer and
// RemoveContainer, event mask 1064: every event nvshim's plugin handles). The stub prints one
// line, "nri-stub synchronized MASK", once containerd has configured and synchronized it,
// and runs until containerd closes the connection or it gets SIGTERM or SIGINT; then it
// prints how many of each event it answered, "nri-stub answered create=N start=N remove=N".
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

type plugin struct {
	mask                  api.EventMask
	create, start, remove atomic.Int64
	reported              sync.Once
}

// report prints the counts once, whichever way the stub ends first.
func (p *plugin) report() {
	p.reported.Do(func() {
		fmt.Printf("nri-stub answered create=%d start=%d remove=%d\n",
			p.create.Load(), p.start.Load(), p.remove.Load())
	})
}

func (p *plugin) Configure(context.Context, string, string, string) (api.EventMask, error) {
	return p.mask, nil
}

func (p *plugin) Synchronize(
	context.Context, []*api.PodSandbox, []*api.Container,
) ([]*api.ContainerUpdate, error) {
	fmt.Printf("nri-stub synchronized %d\n", int32(p.mask))
	return nil, nil
}

func (p *plugin) CreateContainer(
	context.Context, *api.PodSandbox, *api.Container,
) (*api.ContainerAdjustment, []*api.ContainerUpdate, error) {
	p.create.Add(1)
	return nil, nil, nil
}

func (p *plugin) StartContainer(context.Context, *api.PodSandbox, *api.Container) error {
	p.start.Add(1)
	return nil
}

func (p *plugin) RemoveContainer(context.Context, *api.PodSandbox, *api.Container) error {
	p.remove.Add(1)
	return nil
}

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: nri-stub SOCKET INDEX create|same")
		os.Exit(2)
	}
	var mask api.EventMask
	switch os.Args[3] {
	case "create":
		mask.Set(api.Event_CREATE_CONTAINER)
	case "same":
		mask.Set(api.Event_CREATE_CONTAINER, api.Event_START_CONTAINER, api.Event_REMOVE_CONTAINER)
	default:
		fmt.Fprintf(os.Stderr, "nri-stub: unknown events %q: choose create or same\n", os.Args[3])
		os.Exit(2)
	}
	p := &plugin{mask: mask}
	s, err := stub.New(
		p,
		stub.WithPluginName("nri-stub"),
		stub.WithPluginIdx(os.Args[2]),
		stub.WithSocketPath(os.Args[1]),
		stub.WithOnClose(func() {
			p.report()
			os.Exit(0)
		}),
	)
	if err != nil {
		fmt.Fprintf(os.Stderr, "nri-stub: %v\n", err)
		os.Exit(1)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	go func() {
		<-ctx.Done()
		s.Stop()
	}()
	err = s.Run(ctx)
	p.report()
	// an error while stopping on a signal (the listener closed under Serve) is the stop
	if err != nil && ctx.Err() == nil {
		fmt.Fprintf(os.Stderr, "nri-stub: %v\n", err)
		os.Exit(1)
	}
}
