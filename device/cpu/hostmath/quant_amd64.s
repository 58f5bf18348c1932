//go:build amd64

#include "textflag.h"

// The AVX-512 dequantizers of quant.go: each decodes nb whole blocks of
// src into dst (float32), with the operations, in the order, of the Go
// twins in quant_generic.go, so every value is bit for bit the same (a NaN
// scale gives a NaN, perhaps with other payload bits). Loads are unaligned.

// DEQARGS loads a dequantizer's arguments: dst in DI, src in SI, nb in CX.
#define DEQARGS MOVQ dst+0(FP), DI; MOVQ src+8(FP), SI; MOVQ nb+16(FP), CX

// DWORDS sets every dword of z to v.
#define DWORDS(v, z) MOVL $v, AX; VPBROADCASTD AX, z

// F16SCALE sets every float of z to the f16 at off(SI), widened exactly.
#define F16SCALE(off, z) MOVWLZX off(SI), AX; VMOVD AX, X0; VCVTPH2PS X0, X0; VBROADCASTSS X0, z

// STORE32 stores the 32 levels of Z2 and Z3 (dwords), widened to float32
// and multiplied by Z1, at DI.
#define STORE32 VCVTDQ2PS Z2, Z2; VCVTDQ2PS Z3, Z3; VMULPS Z1, Z2, Z2; VMULPS Z1, Z3, Z3; VMOVUPS Z2, (DI); VMOVUPS Z3, 64(DI)

// func deqQ8_0AVX512(dst, src unsafe.Pointer, nb uintptr)
TEXT ·deqQ8_0AVX512(SB), NOSPLIT, $0-24
	DEQARGS
	TESTQ CX, CX
	JEQ q80done
q80loop:
	F16SCALE(0, Z1)
	VPMOVSXBD 2(SI), Z2
	VPMOVSXBD 18(SI), Z3
	STORE32
	ADDQ $34, SI
	ADDQ $128, DI
	DECQ CX
	JNE q80loop
q80done:
	VZEROUPPER
	RET

// func deqQ4_0AVX512(dst, src unsafe.Pointer, nb uintptr)
TEXT ·deqQ4_0AVX512(SB), NOSPLIT, $0-24
	DEQARGS
	DWORDS(15, Z31)
	DWORDS(8, Z30)
	TESTQ CX, CX
	JEQ q40done
q40loop:
	F16SCALE(0, Z1)
	VPMOVZXBD 2(SI), Z2
	VPSRLD $4, Z2, Z3
	VPANDD Z31, Z2, Z2
	VPSUBD Z30, Z2, Z2
	VPSUBD Z30, Z3, Z3
	STORE32
	ADDQ $18, SI
	ADDQ $128, DI
	DECQ CX
	JNE q40loop
q40done:
	VZEROUPPER
	RET

// K4SCALES leaves at 0(SP) the 8 sub-block scales d·sc and at 32(SP) the
// 8 minimums dmin·m of the Q4_K or Q5_K block at SI (ggml's get_scale_min_k4
// on the 12 bytes at 4(SI), as llama.cpp unpacks them in 32-bit words).
#define K4SCALES \
	MOVL (SI), AX; \
	VMOVD AX, X0; \
	VCVTPH2PS X0, X0; \
	VBROADCASTSS X0, Z1; \
	VMOVSHDUP X0, X2; \
	VBROADCASTSS X2, Z2; \
	VINSERTF32X8 $1, Y2, Z1, Z4; \
	MOVL 4(SI), R8; \
	MOVL 8(SI), R9; \
	MOVL 12(SI), R10; \
	MOVL R10, R11; \
	SHRL $4, R11; \
	ANDL $0x0f0f0f0f, R11; \
	MOVL R9, R12; \
	SHRL $6, R12; \
	ANDL $0x03030303, R12; \
	SHLL $4, R12; \
	ORL R12, R11; \
	MOVL R9, R13; \
	ANDL $0x3f3f3f3f, R13; \
	MOVL R10, R12; \
	ANDL $0x0f0f0f0f, R12; \
	MOVL R8, R14; \
	SHRL $6, R14; \
	ANDL $0x03030303, R14; \
	SHLL $4, R14; \
	ORL R14, R12; \
	ANDL $0x3f3f3f3f, R8; \
	VMOVD R8, X3; \
	VPINSRD $1, R12, X3, X3; \
	VPINSRD $2, R13, X3, X3; \
	VPINSRD $3, R11, X3, X3; \
	VPMOVZXBD X3, Z3; \
	VCVTDQ2PS Z3, Z3; \
	VMULPS Z4, Z3, Z3; \
	VMOVUPS Z3, 0(SP)

// Q4KGROUP decodes elements 64j..64j+63 of the Q4_K block at SI: 32 bytes
// of nibbles at 16+32j, low nibbles scaled by sub-block 2j, high by 2j+1.
#define Q4KGROUP(qoff, sa, ma, sb, mb, out) \
	VBROADCASTSS sa(SP), Z5; \
	VBROADCASTSS ma(SP), Z6; \
	VBROADCASTSS sb(SP), Z7; \
	VBROADCASTSS mb(SP), Z8; \
	VPMOVZXBD qoff(SI), Z9; \
	VPMOVZXBD qoff+16(SI), Z10; \
	VPSRLD $4, Z9, Z11; \
	VPSRLD $4, Z10, Z12; \
	VPANDD Z31, Z9, Z9; \
	VPANDD Z31, Z10, Z10; \
	VCVTDQ2PS Z9, Z9; \
	VCVTDQ2PS Z10, Z10; \
	VCVTDQ2PS Z11, Z11; \
	VCVTDQ2PS Z12, Z12; \
	VMULPS Z5, Z9, Z9; \
	VMULPS Z5, Z10, Z10; \
	VMULPS Z7, Z11, Z11; \
	VMULPS Z7, Z12, Z12; \
	VSUBPS Z6, Z9, Z9; \
	VSUBPS Z6, Z10, Z10; \
	VSUBPS Z8, Z11, Z11; \
	VSUBPS Z8, Z12, Z12; \
	VMOVUPS Z9, out(DI); \
	VMOVUPS Z10, out+64(DI); \
	VMOVUPS Z11, out+128(DI); \
	VMOVUPS Z12, out+192(DI)

// func deqQ4_KAVX512(dst, src unsafe.Pointer, nb uintptr)
TEXT ·deqQ4_KAVX512(SB), NOSPLIT, $64-24
	DEQARGS
	DWORDS(15, Z31)
	TESTQ CX, CX
	JEQ q4kdone
q4kloop:
	K4SCALES
	Q4KGROUP(16, 0, 32, 4, 36, 0)
	Q4KGROUP(48, 8, 40, 12, 44, 256)
	Q4KGROUP(80, 16, 48, 20, 52, 512)
	Q4KGROUP(112, 24, 56, 28, 60, 768)
	ADDQ $144, SI
	ADDQ $1024, DI
	DECQ CX
	JNE q4kloop
q4kdone:
	VZEROUPPER
	RET

// Q5KHALF decodes 16 elements of a Q5_K group: Z9 holds the 16 bytes of
// nibbles and Z13 the 16 bytes of qh (both widened to dwords); the fifth bit
// is bit hb of qh. nib is 0 (low nibbles) or 4 (high); the result is scaled
// by Z5 and offset by Z6 and stored at out(DI).
#define Q5KHALF(nib, hb, out) \
	VPSRLD $nib, Z9, Z10; \
	VPANDD Z31, Z10, Z10; \
	VPSRLD $hb, Z13, Z11; \
	VPANDD Z30, Z11, Z11; \
	VPSLLD $4, Z11, Z11; \
	VPORD Z11, Z10, Z10; \
	VCVTDQ2PS Z10, Z10; \
	VMULPS Z5, Z10, Z10; \
	VSUBPS Z6, Z10, Z10; \
	VMOVUPS Z10, out(DI)

// Q5KGROUP decodes elements 64j..64j+63 of the Q5_K block at SI: nibbles at
// 48+32j, fifth bits 2j (low half) and 2j+1 (high half) of qh at 16.
#define Q5KGROUP(qoff, hlo, hhi, sa, ma, sb, mb, out) \
	VBROADCASTSS sa(SP), Z5; \
	VBROADCASTSS ma(SP), Z6; \
	VPMOVZXBD qoff(SI), Z9; \
	VPMOVZXBD 16(SI), Z13; \
	Q5KHALF(0, hlo, out); \
	VPMOVZXBD qoff+16(SI), Z9; \
	VPMOVZXBD 32(SI), Z13; \
	Q5KHALF(0, hlo, out+64); \
	VBROADCASTSS sb(SP), Z5; \
	VBROADCASTSS mb(SP), Z6; \
	VPMOVZXBD qoff(SI), Z9; \
	VPMOVZXBD 16(SI), Z13; \
	Q5KHALF(4, hhi, out+128); \
	VPMOVZXBD qoff+16(SI), Z9; \
	VPMOVZXBD 32(SI), Z13; \
	Q5KHALF(4, hhi, out+192)

// func deqQ5_KAVX512(dst, src unsafe.Pointer, nb uintptr)
TEXT ·deqQ5_KAVX512(SB), NOSPLIT, $64-24
	DEQARGS
	DWORDS(15, Z31)
	DWORDS(1, Z30)
	TESTQ CX, CX
	JEQ q5kdone
q5kloop:
	K4SCALES
	Q5KGROUP(48, 0, 1, 0, 32, 4, 36, 0)
	Q5KGROUP(80, 2, 3, 8, 40, 12, 44, 256)
	Q5KGROUP(112, 4, 5, 16, 48, 20, 52, 512)
	Q5KGROUP(144, 6, 7, 24, 56, 28, 60, 768)
	ADDQ $176, SI
	ADDQ $1024, DI
	DECQ CX
	JNE q5kloop
q5kdone:
	VZEROUPPER
	RET

// Q6KPART decodes 16 elements of a Q6_K block: Z9 holds 16 bytes of ql
// (dwords), Z13 16 bytes of qh; the low 4 bits are ql>>nib & 15, the top
// two qh>>hb & 3; the level q−32 is scaled by the sub-block scale at sc(SP).
#define Q6KPART(nib, hb, sc, out) \
	VPSRLD $nib, Z9, Z10; \
	VPANDD Z31, Z10, Z10; \
	VPSRLD $hb, Z13, Z11; \
	VPANDD Z30, Z11, Z11; \
	VPSLLD $4, Z11, Z11; \
	VPORD Z11, Z10, Z10; \
	VPSUBD Z29, Z10, Z10; \
	VCVTDQ2PS Z10, Z10; \
	VBROADCASTSS sc(SP), Z5; \
	VMULPS Z5, Z10, Z10; \
	VMOVUPS Z10, out(DI)

// Q6KQUAD decodes elements l0..l0+15 of each 32-element quarter of the
// 128-element half whose ql is at qo and qh at ho; s is the offset of the
// half's first sub-block scale (4 bytes each), o its first output byte.
#define Q6KQUAD(qo, ho, l0, s, o) \
	VPMOVZXBD qo+l0(SI), Z9; \
	VPMOVZXBD ho+l0(SI), Z13; \
	Q6KPART(0, 0, s, o+4*l0); \
	Q6KPART(4, 4, s+16, o+256+4*l0); \
	VPMOVZXBD qo+32+l0(SI), Z9; \
	Q6KPART(0, 2, s+8, o+128+4*l0); \
	Q6KPART(4, 6, s+24, o+384+4*l0)

// func deqQ6_KAVX512(dst, src unsafe.Pointer, nb uintptr)
TEXT ·deqQ6_KAVX512(SB), NOSPLIT, $64-24
	DEQARGS
	DWORDS(15, Z31)
	DWORDS(3, Z30)
	DWORDS(32, Z29)
	TESTQ CX, CX
	JEQ q6kdone
q6kloop:
	F16SCALE(208, Z1)
	VPMOVSXBD 192(SI), Z2
	VCVTDQ2PS Z2, Z2
	VMULPS Z1, Z2, Z2
	VMOVUPS Z2, 0(SP)
	Q6KQUAD(0, 128, 0, 0, 0)
	Q6KQUAD(0, 128, 16, 4, 0)
	Q6KQUAD(64, 160, 0, 32, 512)
	Q6KQUAD(64, 160, 16, 36, 512)
	ADDQ $210, SI
	ADDQ $1024, DI
	DECQ CX
	JNE q6kloop
q6kdone:
	VZEROUPPER
	RET
