package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"edgegw/conf"
	"edgegw/edge"
	"edgegw/mbserver"
	"edgegw/ringstore"
	"edgegw/stats"
)

// edgePasser lets mbserver pass requests to the scheduler's bus owners
// without importing edge.
type edgePasser struct{ s *edge.Scheduler }

func (p edgePasser) Pass(ctx context.Context, device string, pdu []byte, origin string) ([]byte, time.Duration, int, error) {
	r, err := p.s.Pass(ctx, edge.PassRequest{Device: device, PDU: pdu, Origin: origin})
	return r.PDU, r.Waited, r.Polls, err
}

var _ mbserver.Passer = edgePasser{}

// newModbusServers maps every [[modbus_server]] onto mbserver (which opens
// nothing until Listen).
func newModbusServers(c *conf.Config, sched *edge.Scheduler, ring *ringstore.Ring, log *slog.Logger) ([]*mbserver.Server, []*stats.ModbusServer, error) {
	var out []*mbserver.Server
	var sts []*stats.ModbusServer
	for _, ms := range c.ModbusServers {
		mc := mbserver.Config{
			Listen: ms.Listen, AllowedNetworks: ms.AllowedNetworks, MaxConns: ms.MaxConnections, MaxInFlight: ms.MaxInFlight,
			IdleTimeout: ms.IdleTimeout, Writes: ms.Writes, Units: map[uint8]string{},
			Passer: edgePasser{sched}, Ring: ring, Stats: &stats.ModbusServer{Listen: ms.Listen},
			Logger: log.With("listen", ms.Listen),
		}
		for _, u := range ms.Units {
			mc.Units[u.Unit] = u.Device
		}
		if m := ms.Mirror; m != nil {
			mm := &mbserver.Mirror{Unit: m.Unit, OnBad: m.OnBad, BadValue: m.BadValue, QualityAddress: m.QualityAddress}
			for _, s := range m.Slots {
				sl := mbserver.Slot{Address: s.Address, Device: s.Device, Tag: s.Tag, Format: s.Format, Multiplier: s.Multiplier, RawWords: s.RawWords}
				if s.Format == mbserver.FormatRaw {
					et, err := mirrorTag(c, s.Device, s.Tag)
					if err != nil {
						return nil, nil, fmt.Errorf("modbus_server %s: mirror: %w", ms.Listen, err)
					}
					sl.Encode = func(v float64) ([]byte, error) { return edge.TagRegisters(&et, v) }
				}
				mm.Slots = append(mm.Slots, sl)
			}
			mc.Mirror = mm
		}
		s, err := mbserver.New(mc)
		if err != nil {
			return nil, nil, fmt.Errorf("modbus_server %s: %w", ms.Listen, err)
		}
		out = append(out, s)
		sts = append(sts, mc.Stats)
	}
	return out, sts, nil
}

// mirrorTag is the edge tag of device/tag, for a raw mirror slot's encoder.
func mirrorTag(c *conf.Config, device, tag string) (edge.Tag, error) {
	for _, d := range c.Devices {
		if d.Name != device {
			continue
		}
		for _, t := range d.Tags {
			if t.Name == tag {
				return edgeTag(t)
			}
		}
	}
	return edge.Tag{}, fmt.Errorf("no tag %s/%s", device, tag)
}
