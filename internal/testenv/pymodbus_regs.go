package testenv

import "testing"

// PymodbusRegisters starts pymodbus (an independent implementation) as a
// Modbus TCP slave on 127.0.0.1 whose holding and input registers 0..
// hold regs, and returns its port once it accepts.
func PymodbusRegisters(t testing.TB, regs []uint16) (tcpPort int) {
	t.Helper()
	return PymodbusSequence(t, regs, nil).Port
}
