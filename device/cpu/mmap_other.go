//go:build !unix

package cpu

import "errors"

const canMap = false

func mapAnon(int) ([]byte, error) { return nil, errors.New("no anonymous mappings") }

func unmap([]byte) error { return nil }
