package redis

import "strings"

// slotCount is the number of Redis Cluster hash slots.
const slotCount = 16384

// crcTable is CRC-16/XMODEM (polynomial 0x1021), the checksum Redis Cluster
// uses to map keys to slots.
var crcTable = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()

// keySlot returns the Redis Cluster slot of key, honouring hash tags: when
// the key holds "{tag}" with a non-empty tag, only the tag is hashed
// (https://redis.io/docs/latest/operate/oss_and_stack/reference/cluster-spec/#hash-tags).
func keySlot(key string) int {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if n := strings.IndexByte(key[open+1:], '}'); n > 0 {
			key = key[open+1 : open+1+n]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc = crc<<8 ^ crcTable[byte(crc>>8)^key[i]]
	}
	return int(crc) % slotCount
}
