package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"edgegw/internal/testenv"
	"edgegw/lab/sim"
	"edgegw/receiver"
)

// countingProxy forwards TCP connections from its address to target and
// counts the bytes each way: up is what the gateway sent (what the uplink
// costs), down what came back (acks, PUBACKs, pongs). It stands on the
// receiving side of the real connection, so what it counts is what crossed
// the socket, framing and all.
type countingProxy struct {
	ln       net.Listener
	target   string
	up, down atomic.Int64
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    []net.Conn
}

func startCountingProxy(t *testing.T, target string) *countingProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &countingProxy{ln: ln, target: target}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); p.copy(s, c, &p.up); s.Close() }()
			go func() { defer p.wg.Done(); p.copy(c, s, &p.down); c.Close() }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *countingProxy) copy(dst, src net.Conn, n *atomic.Int64) {
	buf := make([]byte, 32<<10)
	for {
		k, err := src.Read(buf)
		if k > 0 {
			n.Add(int64(k))
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				_ = err // a reset at the end of the test
			}
			return
		}
	}
}

func (p *countingProxy) addr() string { return p.ln.Addr().String() }

// uplinkFigure is one measurement: bytes on the socket per stored sample.
type uplinkFigure struct {
	name               string
	samples, batches   uint64
	up, down           int64
	perSample, ackPerS float64
}

// measureUplink runs the gateway binary with 48 simulated loggers × 2 tags
// at 1 s (the soak's load, the default batch settings) against upstream
// (the config's [upstream…] sections, with PROXY where the proxied address
// goes) and measures, between the first stored samples and secs later,
// the bytes the proxy counted per sample stored.
func measureUplink(t *testing.T, name string, fleet *sim.Fleet, upstream string, p *countingProxy, r *receiver.Receiver, secs int) uplinkFigure {
	t.Helper()
	cfg := loggersConfig(t, "gw-01", fleet, strings.ReplaceAll(upstream, "PROXY", p.addr()), "1s", "200ms")
	stored := func() uint64 { return r.Stats().Samples }
	gw, _ := runGateway(t, cfg)
	defer gw.Stop(os.Interrupt, 20*time.Second)
	// Start after the first minute's warm-up is not needed: the figures
	// are deltas from the first 500 stored samples on.
	waitFor(t, 60*time.Second, name+": first samples stored", func() bool { return stored() >= 500 })
	b0 := r.Stats().Batches
	s0, u0, d0 := stored(), p.up.Load(), p.down.Load()
	start := time.Now()
	waitFor(t, time.Duration(secs+60)*time.Second, name+": the measuring time", func() bool { return time.Since(start) >= time.Duration(secs)*time.Second })
	s1, u1, d1 := stored(), p.up.Load(), p.down.Load()
	f := uplinkFigure{name: name, samples: s1 - s0, up: u1 - u0, down: d1 - d0, batches: r.Stats().Batches - b0}
	if f.samples < 96*uint64(secs)/2 {
		t.Fatalf("%s: only %d samples stored in %d s (want about %d)", name, f.samples, secs, 96*secs)
	}
	f.perSample = float64(f.up) / float64(f.samples)
	f.ackPerS = float64(f.down) / float64(f.samples)
	return f
}

// TestUplinkBytes measures what a sample costs on the uplink's socket, at
// the default batch settings and the soak's load (48 loggers × 2 tags at
// 1 s): WebSocket with permessage-deflate, without, and MQTT's batch topic
// (QoS 1). It prints the figures (go test -v -run TestUplinkBytes; seconds
// per case from EDGEGW_UPLINK_SECONDS, 30 by default); docs/BENCHMARKS.md
// "Uplink bytes" quotes them. It asserts only what holds under any load:
// deflate at least halves the bytes.
func TestUplinkBytes(t *testing.T) {
	if testing.Short() {
		t.Skip("measures for a minute and more")
	}
	secs := 30
	if s, err := strconv.Atoi(os.Getenv("EDGEGW_UPLINK_SECONDS")); err == nil && s > 0 {
		secs = s
	}
	fleet := runFleet(t, sim.Config{Devices: 48, Transport: "udp"})
	var figs []uplinkFigure

	for _, compression := range []bool{true, false} {
		r := receiver.New(receiver.Config{Logger: nil})
		ctx, cancel := context.WithCancel(context.Background())
		addr, err := r.Listen()
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- r.Serve(ctx) }()
		p := startCountingProxy(t, addr.String())
		name := "websocket, deflate"
		if !compression {
			name = "websocket, plain"
		}
		up := fmt.Sprintf("[upstream.websocket]\nurl = \"ws://PROXY/ingest\"\ncompression = %v\n", compression)
		figs = append(figs, measureUplink(t, name, fleet, up, p, r, secs))
		cancel()
		testenv.Recv(t, done, 10*time.Second, "the receiver's Serve to return")
	}

	// MQTT: the gateway with no WebSocket, its batches to mosquitto
	// through the proxy, stored by a receiver subscribed to the topic.
	mosq := testenv.StartMosquitto(t)
	p := startCountingProxy(t, mosq.Addr)
	r := receiver.New(receiver.Config{})
	sub, err := receiver.NewMQTT(r, receiver.MQTTConfig{Brokers: []string{"tcp://" + mosq.Addr}, ClientID: "uplink-bytes"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	up := "[upstream.mqtt]\nbroker = \"tcp://PROXY\"\ntopic_prefix = \"edgegw/gw-01\"\nper_tag_topics = false\n"
	figs = append(figs, measureUplink(t, "mqtt batch topic (QoS 1)", fleet, up, p, r, secs))
	cancel()
	testenv.Recv(t, done, 10*time.Second, "the MQTT ingest's Run to return")

	t.Logf("uplink bytes per stored sample, 48 loggers × 2 tags at 1 s, default batch settings, %d s each:", secs)
	for _, f := range figs {
		t.Logf("  %-26s %6d samples in %4d batches (%5.1f a batch)  %8d B up (%5.1f B/sample)  %6d B back (%4.1f B/sample)",
			f.name, f.samples, f.batches, float64(f.samples)/float64(max(f.batches, 1)), f.up, f.perSample, f.down, f.ackPerS)
	}
	if figs[0].perSample*2 > figs[1].perSample {
		t.Errorf("deflate %.1f B/sample, plain %.1f: deflate does not halve the bytes (negotiated?)", figs[0].perSample, figs[1].perSample)
	}
}
