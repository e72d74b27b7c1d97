/*
Package remote provides access to actors across a network or other I/O connection.
*/
package remote
