// Package imports holds the module's import-rule test: every import of every
// non-test Go file of the module, checked against the table of allowed edges
// in docs/DESIGN.md (the fenced block marked "imports"). The table is the
// design's picture written out, bottom up; the test allows no edge it does
// not name and names no edge the code does not use, so the picture cannot
// drift from the code. The package itself holds no code.
package imports
