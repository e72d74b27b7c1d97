package zmtp

import (
	"context"
	"strconv"
	"testing"

	"github.com/go-zeromq/zmq4"
)

// BenchmarkSubIngest measures receiving KV-event-sized messages (topic, seq, payload) on a
// SUB: this package's Conn, and go-zeromq/zmq4's SUB (the subscriber the router used
// before) as the baseline, both fed by the same publisher side.
func BenchmarkSubIngest(b *testing.B) {
	for _, size := range []int{256, 4096, 65536} {
		for _, impl := range []string{"zmtp", "zmq4"} {
			b.Run(strconv.Itoa(size)+"B/"+impl, func(b *testing.B) {
				payload := make([]byte, size)
				seq, topic := make([]byte, 8), []byte("kv")
				ready := make(chan struct{})
				l, err := Listen("tcp://127.0.0.1:0", ListenerConfig{SocketType: "PUB"}, func(c *Conn) error {
					if _, err := c.ReadMessage(); err != nil { // the subscription
						return err
					}
					<-ready
					for range b.N {
						if err := c.WriteMessage(topic, seq, payload); err != nil {
							return err
						}
					}
					_, err := c.ReadMessage() // until the subscriber leaves
					return err
				})
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				b.ReportAllocs()
				b.SetBytes(int64(size + 10))
				switch impl {
				case "zmtp":
					c, err := Dial(ctx, l.Endpoint(), "SUB", testWait, Limits{})
					if err != nil {
						b.Fatal(err)
					}
					defer c.Close()
					if err := c.Subscribe(nil); err != nil {
						b.Fatal(err)
					}
					b.ResetTimer()
					close(ready)
					for range b.N {
						if _, err := c.ReadMessage(); err != nil {
							b.Fatal(err)
						}
					}
				case "zmq4":
					sub := zmq4.NewSub(ctx)
					defer sub.Close()
					if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
						b.Fatal(err)
					}
					if err := sub.Dial(l.Endpoint()); err != nil {
						b.Fatal(err)
					}
					b.ResetTimer()
					close(ready)
					for range b.N {
						if _, err := sub.Recv(); err != nil {
							b.Fatal(err)
						}
					}
				}
			})
		}
	}
}
