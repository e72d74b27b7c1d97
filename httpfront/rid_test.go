package httpfront

import "testing"

func TestNewRID(t *testing.T) {
	s := &Server{ridPrefix: newRIDPrefix(0x0123456789abcdef)}
	s.ridSeq.Store(0xfe)
	tests := []struct {
		name string
		want string
	}{
		{name: "first", want: "switchyard-0123456789abcdef00000000000000ff"},
		{name: "second", want: "switchyard-0123456789abcdef0000000000000100"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r rid
			s.newRID(&r)
			if got := r.String(); got != tt.want || len(got) != ridLen {
				t.Errorf("newRID = %q (%d bytes), want %q (%d)", got, len(got), tt.want, ridLen)
			}
		})
	}
}
