//go:build unix

package fleet

// rawSockets says whether NewSocket makes Sockets: on Unix, where SysRead and SysWrite are
// read(2) and write(2) of the socket's descriptor.
const rawSockets = true
