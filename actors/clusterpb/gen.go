// Package clusterpb holds the protobuf messages router replicas exchange through Proto.Actor
// remote (whose wire format is protobuf): affinity partition commands, binding hand-off, and
// the gossip state of in-flight counts and worker changes. switchyard_cluster.pb.go is generated from
// switchyard_cluster.proto by go generate (protoc and protoc-gen-go v1.33.0).
package clusterpb

//go:generate protoc --go_out=. --go_opt=paths=source_relative switchyard_cluster.proto
