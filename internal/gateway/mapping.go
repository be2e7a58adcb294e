package gateway

import (
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"time"

	"edgegw/conf"
	"edgegw/edge"
	"edgegw/edge/modbus"
	"edgegw/history"
	"edgegw/ringstore"
	"edgegw/stats"
	"edgegw/tagtype"
	"edgegw/web"
)

// newScheduler maps the config onto edge and builds the scheduler (which
// opens nothing until Run): the gateway runs it, check prints its plan.
func newScheduler(c *conf.Config, sink edge.Sink, acq *stats.Acquisition, log *slog.Logger) (*edge.Scheduler, error) {
	ec, err := edgeConfig(c)
	if err != nil {
		return nil, err
	}
	ec.Sink, ec.Acquisition = sink, acq
	ec.Logger = log
	return edge.New(ec)
}

// edgeConfig maps the resolved config onto edge's own Config.
func edgeConfig(c *conf.Config) (edge.Config, error) {
	ec := edge.Config{
		TCPMode:        c.Poll.TCPMode,
		UDPListen:      c.Poll.UDPListen,
		UDPBufferBytes: int(c.Poll.UDPBufferBytes),
	}
	for _, d := range c.Devices {
		dc := edge.DeviceConfig{
			Name: d.Name, Transport: d.Transport, Address: d.Address, Unit: d.Unit,
			Interval: d.Interval, Timeout: d.Timeout, Retries: d.Retries, WriteTransport: d.WriteTransport,
			MaxGap: d.MaxGap, MaxRegs: d.MaxRegisters, MaxBits: c.Poll.MaxBits,
			Serial: modbus.SerialConfig{
				Baud: d.Serial.Baud, DataBits: d.Serial.DataBits, Parity: d.Serial.Parity, StopBits: d.Serial.StopBits,
				RS485: modbus.RS485Config{Enabled: d.Serial.RS485, RtsHighDuringSend: d.Serial.RS485,
					DelayRtsBeforeSend: d.Serial.RS485DelayRTSBeforeSend, DelayRtsAfterSend: d.Serial.RS485DelayRTSAfterSend},
			},
		}
		if d.Transport != conf.TransportUDP { // a UDP device has no connection to share
			ep := c.EndpointOf(d.Address)
			dc.MaxConnections, dc.Pause = ep.MaxConnections, ep.Pause
		}
		for _, t := range d.Tags {
			et, err := edgeTag(t)
			if err != nil {
				return ec, fmt.Errorf("device %q: tag %q: %w", d.Name, t.Name, err)
			}
			dc.Tags = append(dc.Tags, et)
		}
		ec.Devices = append(ec.Devices, dc)
	}
	return ec, nil
}

func edgeTag(t conf.Tag) (edge.Tag, error) {
	reg, err := tagtype.ParseRegister(t.Register)
	if err != nil {
		return edge.Tag{}, err
	}
	typ, err := tagtype.Parse(t.Type)
	if err != nil {
		return edge.Tag{}, err
	}
	order, err := tagtype.ParseOrder(t.Order)
	if err != nil {
		return edge.Tag{}, err
	}
	loc, err := tagtype.ParseLocation(t.StringLocation)
	if err != nil {
		return edge.Tag{}, err
	}
	return edge.Tag{
		Name: t.Name, Register: reg, Address: t.Address, Type: typ, Order: order, Bit: t.Bit, Length: t.Length,
		Location: loc, Scale: t.Scale, Offset: t.Offset, Unit: t.Unit, Deadband: t.Deadband, Interval: t.Interval,
		DeadbandPercent: t.DeadbandPercent, MaxSilence: t.MaxSilence,
		Writable: t.Writable, Min: t.Min, Max: t.Max,
	}, nil
}

// Ring sizing when [ring] size is not set: enough samples for a client to
// resume resumeWindow back at the configured poll rate, never fewer than
// ringstore.DefaultRingSize, never more than [ring] max_bytes of samples.
const resumeWindow = 60 * time.Second

// samplesPerSecond is the configured rate: every device's tags per interval.
func samplesPerSecond(c *conf.Config) float64 {
	var r float64
	for _, d := range c.Devices {
		if d.Interval > 0 {
			r += float64(len(d.Tags)) / d.Interval.Seconds()
		}
	}
	return r
}

// ringSize is [ring] size, or the size that holds resumeWindow of samples
// at the configured rate (at most [ring] max_bytes), and the window it gives.
func ringSize(c *conf.Config) (int, time.Duration) {
	rate := samplesPerSecond(c)
	n := c.Ring.Size
	if n <= 0 {
		n = int(math.Ceil(rate * resumeWindow.Seconds()))
		maxBytes := c.Ring.MaxBytes
		if maxBytes <= 0 { // a Config not from conf.Parse
			maxBytes = conf.DefaultRingMax
		}
		n = min(max(n, ringstore.DefaultRingSize), int(maxBytes)/ringstore.SlotBytes)
	}
	if rate == 0 {
		return n, 0
	}
	return n, time.Duration(float64(n) / rate * float64(time.Second))
}

// historyConfig maps the config onto history's Config.
func historyConfig(c *conf.Config, devices func() []stats.Entry, log *slog.Logger) history.Config {
	hc := history.Config{Devices: devices, Logger: log,
		RawWindow: c.History.RawWindow, FineKeep: c.History.FineKeep, Keep: c.History.Keep, MaxRAM: c.History.MaxRAM}
	if c.Gateway.DataDir != "" {
		hc.Dir = filepath.Join(c.Gateway.DataDir, "history")
	}
	return hc
}

// webLimits maps [http] exempt_loopback and [http.limits] onto web's
// RateLimits (zero fields are web's defaults, negative ones "no limit").
func webLimits(h conf.HTTP) web.RateLimits {
	l := h.Limits
	return web.RateLimits{
		Poll: web.Rate{PerSec: l.PollRate, Burst: l.PollBurst}, Read: web.Rate{PerSec: l.ReadRate, Burst: l.ReadBurst},
		Connect: web.Rate{PerSec: l.ConnectRate, Burst: l.ConnectBurst}, Monitor: web.Rate{PerSec: l.MonitorRate, Burst: l.MonitorBurst},
		Write: web.Rate{PerSec: l.WriteRate, Burst: l.WriteBurst}, Auth: web.Rate{PerSec: l.AuthRate, Burst: l.AuthBurst},
		ConnsPerClient: l.ConnectionsPerClient, ExemptLoopback: h.ExemptLoopback,
	}
}
