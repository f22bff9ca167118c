// A small PNG reader for the desktop tests: the size of a PNG and its
// pixels (8-bit RGB or RGBA, not interlaced: what scrot writes), so a
// check can say which part of a screenshot changed.

import { inflateSync } from 'node:zlib'

const signature = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a])

/** The width and height in a PNG's header. */
export function pngSize(buf) {
  if (buf.length < 24 || !buf.subarray(0, 8).equals(signature) || buf.toString('latin1', 12, 16) !== 'IHDR') {
    throw new Error(`not a PNG (${buf.length} bytes, starting ${buf.subarray(0, 8).toString('hex')})`)
  }
  return { width: buf.readUInt32BE(16), height: buf.readUInt32BE(20) }
}

/** Decodes a PNG into { width, height, channels, pixels }. */
export function decodePNG(buf) {
  const { width, height } = pngSize(buf)
  const depth = buf[24]
  const colour = buf[25]
  const interlace = buf[28]
  const channels = { 2: 3, 6: 4 }[colour]
  if (depth !== 8 || !channels || interlace !== 0) {
    throw new Error(`PNG of bit depth ${depth}, colour type ${colour}, interlace ${interlace}: want 8-bit RGB or RGBA, not interlaced`)
  }
  const idat = []
  for (let off = 8; off + 8 <= buf.length; ) {
    const len = buf.readUInt32BE(off)
    const type = buf.toString('latin1', off + 4, off + 8)
    if (type === 'IDAT') idat.push(buf.subarray(off + 8, off + 8 + len))
    if (type === 'IEND') break
    off += 12 + len
  }
  const raw = inflateSync(Buffer.concat(idat))
  const stride = width * channels
  const pixels = Buffer.alloc(stride * height)
  for (let y = 0; y < height; y++) {
    const filter = raw[y * (stride + 1)]
    const line = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1))
    const out = pixels.subarray(y * stride, (y + 1) * stride)
    const prev = y > 0 ? pixels.subarray((y - 1) * stride, y * stride) : Buffer.alloc(stride)
    for (let i = 0; i < stride; i++) {
      const a = i >= channels ? out[i - channels] : 0
      const b = prev[i]
      const c = i >= channels ? prev[i - channels] : 0
      let v = line[i]
      switch (filter) {
        case 0: break
        case 1: v += a; break
        case 2: v += b; break
        case 3: v += (a + b) >> 1; break
        case 4: {
          const p = a + b - c
          const pa = Math.abs(p - a), pb = Math.abs(p - b), pc = Math.abs(p - c)
          v += pa <= pb && pa <= pc ? a : pb <= pc ? b : c
          break
        }
        default: throw new Error(`PNG line ${y}: filter ${filter}`)
      }
      out[i] = v & 0xff
    }
  }
  return { width, height, channels, pixels }
}

/**
 * How many pixels differ between two decoded images of one size inside
 * the rectangle [x0, x1) × [y0, y1) (the whole image by default).
 */
export function changedPixels(a, b, rect = {}) {
  if (a.width !== b.width || a.height !== b.height) throw new Error(`sizes differ: ${a.width}x${a.height} and ${b.width}x${b.height}`)
  const { x0 = 0, y0 = 0, x1 = a.width, y1 = a.height } = rect
  let n = 0
  for (let y = y0; y < y1; y++) {
    for (let x = x0; x < x1; x++) {
      const i = (y * a.width + x) * a.channels
      const j = (y * b.width + x) * b.channels
      if (a.pixels[i] !== b.pixels[j] || a.pixels[i + 1] !== b.pixels[j + 1] || a.pixels[i + 2] !== b.pixels[j + 2]) n++
    }
  }
  return n
}
