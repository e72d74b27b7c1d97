//go:build amd64 && !purego

#include "textflag.h"

// func prefetch(p *[pipeBatch]unsafe.Pointer, n int) uint64
TEXT ·prefetch(SB), NOSPLIT|NOFRAME, $0-24
	MOVQ p+0(FP), AX
	MOVQ n+8(FP), CX
	TESTQ CX, CX
	JLE done
loop:
	MOVQ (AX), DX
	PREFETCHT0 (DX)
	ADDQ $8, AX
	DECQ CX
	JNZ loop
done:
	MOVQ $0, ret+16(FP)
	RET
