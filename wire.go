package main

import (
	"fmt"

	"edgegw/conf"
	"edgegw/edge"
	"edgegw/edge/modbus"
)

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
	reg, err := edge.ParseRegister(t.Register)
	if err != nil {
		return edge.Tag{}, err
	}
	typ, err := edge.ParseType(t.Type)
	if err != nil {
		return edge.Tag{}, err
	}
	order, err := edge.ParseOrder(t.Order)
	if err != nil {
		return edge.Tag{}, err
	}
	return edge.Tag{
		Name: t.Name, Register: reg, Address: t.Address, Type: typ, Order: order, Bit: t.Bit,
		Scale: t.Scale, Offset: t.Offset, Unit: t.Unit, Deadband: t.Deadband,
		Writable: t.Writable, Min: t.Min, Max: t.Max,
	}, nil
}
