package rules

import "fmt"

// Error is one problem found in a rule file, or in a Source given to
// Build. Parse and Build join every Error they find with errors.Join, in
// source order and, within a source, in document order; walk the joined
// error's Unwrap() []error to get them one by one.
type Error struct {
	// File is the file's name as given in File.Name, or the Source's Name.
	File string
	// Line is the 1-based line of the problem, or 0 when there is no
	// usable line (a Source, a YAML syntax error without position).
	Line int
	// Msg says what is wrong, without the file and line.
	Msg string
}

// Error formats the problem as "rules: file:line: msg".
func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("rules: %s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("rules: %s: %s", e.File, e.Msg)
}
