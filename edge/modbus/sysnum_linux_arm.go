package modbus

const sysRecvmmsg, sysSendmmsg = 365, 374
