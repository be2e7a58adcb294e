package modbus

const sysRecvmmsg, sysSendmmsg = 243, 269
