package modbus

const sysRecvmmsg, sysSendmmsg = 299, 307
