package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/memwall/memwall/device"
	"github.com/memwall/memwall/half"
)

// selfTest runs the flash-prefill and decode attention kernels once each on
// a small case against the split kernel (which they replace for their
// shapes), and the single-token GEMV against the two-row one, and turns off
// any that disagree, recording why in s.disabled: a
// wrong fast kernel falls back to the general one instead of corrupting a
// model's output. It runs at Load on a real GPU only (compute capability
// known) and costs a few milliseconds; when it cannot run (an error), Load
// keeps to the general kernels and records the error.
func (s *Set) selfTest() error {
	const (
		kvH, G, hd, bt = 2, 4, 128, 16
		nH             = kvH * G
		start, T       = 64, 20 // flash: 20 tokens after 64 cached
		ctx            = 320    // decode: one token at position ctx-1 (three splits)
	)
	L := KVLayout{BlockTokens: bt, KVHeads: kvH, HeadDim: hd, Layers: 1, DType: BF16, BlockBytes: 2 * bt * kvH * hd * 2}
	nblk := (ctx + bt - 1) / bt
	rng := rand.New(rand.NewPCG(0x6d656d77, 0x616c6c))
	cache := make([]byte, uint64(nblk)*L.BlockBytes)
	for i := 0; i+1 < len(cache); i += 2 {
		binary.LittleEndian.PutUint16(cache[i:], half.F32ToBF16(float32(rng.NormFloat64())))
	}
	table := make([]byte, 4*nblk)
	for i, b := range rng.Perm(nblk) {
		binary.LittleEndian.PutUint32(table[4*i:], uint32(b))
	}
	q := make([]float32, T*nH*hd)
	for i := range q {
		q[i] = RoundTo(BF16, float32(rng.NormFloat64()))
	}
	qb, _ := Encode(F32, q)
	outBytes := uint64(4 * T * nH * hd)
	st, err := s.d.NewStream()
	if err != nil {
		return err
	}
	s.probeOverlap(st)
	defer func() {
		s.scratchMu.Lock()
		if b, ok := s.scratch[st]; ok {
			s.d.Free(b.p)
			delete(s.scratch, st)
		}
		s.scratchMu.Unlock()
		s.d.DestroyStream(st)
	}()
	var bufs []device.Ptr
	defer func() {
		for _, p := range bufs {
			s.d.Free(p)
		}
	}()
	up := func(b []byte) (device.Ptr, error) {
		p, err := s.d.Alloc(uint64(max(len(b), 256)))
		if err != nil {
			return 0, err
		}
		bufs = append(bufs, p)
		return p, s.d.CopyHtoD(p, b, st)
	}
	pc, err := up(cache)
	if err != nil {
		return err
	}
	pt, err := up(table)
	if err != nil {
		return err
	}
	pq, err := up(qb)
	if err != nil {
		return err
	}
	run := func(flash, decode bool, start, T uint32, qOff uint64) ([]float32, error) {
		s.flash, s.decodeOff = flash, !decode
		out, err := s.d.Alloc(outBytes)
		if err != nil {
			return nil, err
		}
		bufs = append(bufs, out)
		if err := s.Attention(pq.Add(qOff), pc, pt, start, T, nH, L, 0, 0.088, out, F32, st); err != nil {
			return nil, err
		}
		b := make([]byte, 4*T*nH*hd)
		if err := s.d.CopyDtoH(b, out, st); err != nil {
			return nil, err
		}
		if err := s.d.StreamSynchronize(st); err != nil {
			return nil, err
		}
		return Decode(F32, b)
	}
	flash, decodeOff := s.flash, s.decodeOff
	defer func() { s.flash, s.decodeOff = flash, decodeOff }()
	check := func(what string, fast bool, start, T uint32, qOff uint64, tol float64) (bool, error) {
		ref, err := run(false, false, start, T, qOff)
		if err != nil {
			return false, err
		}
		got, err := run(fast && what == "flash", fast && what == "decode", start, T, qOff)
		if err != nil {
			return false, err
		}
		var num, den float64
		for i, r := range ref {
			d := float64(got[i]) - float64(r)
			num += d * d
			den += float64(r) * float64(r)
		}
		e := math.Sqrt(num / den)
		if !(e <= tol) {
			s.disabled = append(s.disabled, fmt.Sprintf("%s attention: self-test relative error %.3g against the split kernel (tolerance %.0e)", what, e, tol))
			return false, nil
		}
		return true, nil
	}
	if flash {
		ok, err := check("flash", true, start, T, 0, 2e-2)
		if err != nil {
			return err
		}
		if !ok {
			flash, s.flashOK = false, false
		}
	}
	ok, err := check("decode", true, ctx-1, 1, 0, 1e-4)
	if err != nil {
		return err
	}
	if !ok {
		decodeOff = true
	}
	return s.selfTestGemv(st, up)
}

// selfTestGemv compares each fast GEMV variant (gemv.go) with
// memwall_gemv_bf16, the two-row kernel, on a 300×4096 product (T = 1 for
// the single-token variants, T = 3 for the others, the streamed ones on the
// grid Matmul would give them) and turns off the ones that disagree, so
// that Matmul falls back to the two-row kernel.
func (s *Set) selfTestGemv(st device.Stream, up func([]byte) (device.Ptr, error)) error {
	const M, K, T = 300, 4096, 3
	rng := rand.New(rand.NewPCG(0x67656d76, 1))
	w := make([]float32, M*K)
	for i := range w {
		w[i] = float32(rng.NormFloat64())
	}
	x := make([]float32, T*K)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	wb, _ := Encode(BF16, w)
	xb, _ := Encode(BF16, x)
	pw, err := up(wb)
	if err != nil {
		return err
	}
	px, err := up(xb)
	if err != nil {
		return err
	}
	kinds := []int{gemvTwo, gemvOne, gemvMMA}
	py, err := up(make([]byte, 4*M*T*len(kinds)))
	if err != nil {
		return err
	}
	for i, k := range kinds {
		p := gemvPlan{kind: k, grid: gemvGrid(k, M, s.sms, gemvBlocksPerSM)}
		if err := s.launchGemv(p, BF16, pw, px, py.Add(uint64(4*M*T*i)), M, K, min(T, gemvMaxT(k)), st); err != nil {
			return err
		}
	}
	b := make([]byte, 4*M*T*len(kinds))
	if err := s.d.CopyDtoH(b, py, st); err != nil {
		return err
	}
	if err := s.d.StreamSynchronize(st); err != nil {
		return err
	}
	all, _ := Decode(F32, b)
	ref := all[:M*T]
	for i, k := range kinds[1:] {
		n := M * int(min(T, gemvMaxT(k)))
		got := all[(i+1)*M*T:][:n]
		var num, den float64
		for j, r := range ref[:n] {
			d := float64(got[j]) - float64(r)
			num += d * d
			den += float64(r) * float64(r)
		}
		if e := math.Sqrt(num / den); !(e <= 1e-5) {
			s.disabled = append(s.disabled, fmt.Sprintf("GEMV %s: self-test relative error %.3g against the two-row kernel", gemvName(k, BF16), e))
			s.gemvOff[k] = true
		}
	}
	return nil
}

// probeOverlap launches the spin kernel overlapped behind another, and
// turns overlapped launches off (recording why) when the driver refuses
// them or the stream then fails, so the Set keeps plain launches instead of
// failing every kernel.
func (s *Set) probeOverlap(st device.Stream) {
	if !s.overlapOn {
		return
	}
	err := s.Spin(0, st)
	if err == nil {
		err = s.Spin(0, st)
	}
	if err == nil {
		err = s.d.StreamSynchronize(st)
	}
	if err != nil {
		s.overlap, s.overlapOn = nil, false
		s.disabled = append(s.disabled, "overlapped launches: "+err.Error())
	}
}

// Disabled lists the fast kernels Load turned off because they failed its
// self-test against the general kernels, each with the error measured.
func (s *Set) Disabled() []string { return append([]string(nil), s.disabled...) }
