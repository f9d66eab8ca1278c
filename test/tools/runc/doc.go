// Package runc names the runc test/tools/build.sh builds for the k3s stand-in's node (see
// go.mod's tool line).
package runc
