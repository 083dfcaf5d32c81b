// nvidia-nri runs NVIDIA's own NRI plugin (the GPU Operator's NRI mode: CDI devices from a
// pod's nvidia.cdi.k8s.io annotations), built from nvidia-container-toolkit's published Go
// module, so that nvshim's tests can run it beside nvshim's agent.
//
// Usage: nvidia-nri SOCKET INDEX [MANAGEMENT-NAMESPACE...]
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-ctk-installer/container/runtime/nri"
)

type logger struct{}

func say(level, format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, level+" "+format+"\n", args...)
}

func (logger) Debugf(f string, a ...interface{})   { say("debug", f, a...) }
func (logger) Errorf(f string, a ...interface{})   { say("error", f, a...) }
func (logger) Infof(f string, a ...interface{})    { say("info", f, a...) }
func (logger) Warningf(f string, a ...interface{}) { say("warning", f, a...) }
func (logger) Tracef(f string, a ...interface{})   { say("trace", f, a...) }

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: nvidia-nri SOCKET INDEX [MANAGEMENT-NAMESPACE...]")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	plugin := nri.NewPlugin(ctx, logger{}, os.Args[3:])
	if err := plugin.Start(ctx, os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "nvidia-nri:", err)
		os.Exit(1)
	}
	say("info", "nvidia-nri started on %s", os.Args[1])
	<-ctx.Done()
	plugin.Stop()
}
