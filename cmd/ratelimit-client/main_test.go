package main

import "testing"

func TestParseDescriptor(t *testing.T) {
	d, err := parseDescriptor("user=alice,path=/a=b")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.GetEntries()) != 2 || d.GetEntries()[1].GetKey() != "path" || d.GetEntries()[1].GetValue() != "/a=b" {
		t.Errorf("parseDescriptor = %v", d)
	}
	for _, bad := range []string{"novalue", "=x", "a=1,,b=2"} {
		if _, err := parseDescriptor(bad); err == nil {
			t.Errorf("parseDescriptor(%q) succeeded, want an error", bad)
		}
	}
}
