-- The dissector's hand-written half: it walks a frame with the tables the generated half
-- declares above it (layouts, enums, constants from datapath/protocol), in the codec's
-- order of checks (datapath/protocol/codec.py, decode_frame), and flags a malformed frame
-- with the codec's reason and byte offset: field topicwire.malformed and an expert item.

local proto = Proto("topicwire", "topicwire native protocol v1")
local F = {}
local field_list = {}

local function declare(abbr, pf)
  if F[abbr] == nil then
    F[abbr] = pf
    field_list[#field_list + 1] = pf
  end
  return F[abbr]
end

local UINT = {[1] = ProtoField.uint8, [2] = ProtoField.uint16, [4] = ProtoField.uint32,
              [8] = ProtoField.uint64}

local function declare_ints(prefix, fields)
  for _, f in ipairs(fields) do
    local abbr = prefix .. "." .. f.name
    local values = f.enum and ENUMS[f.enum] or nil
    declare(abbr, UINT[f.width](abbr, f.name, f.hex and base.HEX or base.DEC, values))
  end
end

declare_ints("topicwire", HEADER_FIELDS)
declare_ints("topicwire.message", MESSAGE_FIELDS)
declare_ints("topicwire.auth", AUTH_FIELDS)
declare("topicwire.auth.mac", ProtoField.bytes("topicwire.auth.mac", "mac"))
declare("topicwire.message.payload", ProtoField.bytes("topicwire.message.payload", "payload"))
declare("topicwire.message.topic", ProtoField.string("topicwire.message.topic", "topic"))
declare("topicwire.message.topic_name",
        ProtoField.string("topicwire.message.topic_name", "topic (from REGISTRY_UPDATE)"))
declare("topicwire.message", ProtoField.none("topicwire.message", "message"))
declare("topicwire.entry", ProtoField.none("topicwire.entry", "entry"))
declare("topicwire.auth", ProtoField.none("topicwire.auth", "authentication trailer"))
declare("topicwire.malformed", ProtoField.string("topicwire.malformed", "malformed"))
declare("topicwire.malformed_offset",
        ProtoField.uint32("topicwire.malformed_offset", "malformed at byte"))
for _, layout in pairs(ADMIN_LAYOUTS) do
  local prefix = "topicwire." .. layout.entry
  declare_ints(prefix, layout.fields)
  declare_ints("topicwire." .. layout.body_name, layout.body_fields)
  for _, name in ipairs(layout.texts) do
    declare(prefix .. "." .. name, ProtoField.string(prefix .. "." .. name, name))
  end
end
proto.fields = field_list

local malformed_expert = ProtoExpert.new("topicwire.malformed.expert", "malformed frame",
                                         expert.group.MALFORMED, expert.severity.ERROR)
proto.experts = {malformed_expert}

-- Topic key (hex text) -> topic, from the REGISTRY_UPDATE entries dissected so far in this
-- capture: messages carry keys only. `tshark -2` names keys whose update comes later too.
local topic_names = {}
function proto.init()
  topic_names = {}
end

local function align8(n)
  return n + (C.FRAME_ALIGNMENT_BYTES - n % C.FRAME_ALIGNMENT_BYTES) % C.FRAME_ALIGNMENT_BYTES
end

local function has_bits_outside(value, known)
  local bitv = 1
  while bitv <= value do
    if math.floor(value / bitv) % 2 == 1 and math.floor(known / bitv) % 2 == 0 then
      return true
    end
    bitv = bitv * 2
  end
  return false
end

-- Python's strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF.
local function utf8_ok(tvb, pos, size)
  local bytes = tvb:raw(pos, size)
  local i, n = 1, #bytes
  while i <= n do
    local c = bytes:byte(i)
    local need, low, high = 0, 0x80, 0xBF
    if c < 0x80 then need = 0
    elseif c >= 0xC2 and c <= 0xDF then need = 1
    elseif c == 0xE0 then need, low = 2, 0xA0
    elseif c == 0xED then need, high = 2, 0x9F
    elseif c >= 0xE1 and c <= 0xEF then need = 2
    elseif c == 0xF0 then need, low = 3, 0x90
    elseif c >= 0xF1 and c <= 0xF3 then need = 3
    elseif c == 0xF4 then need, high = 3, 0x8F
    else return false end
    if i + need > n then return false end
    for k = 1, need do
      local b = bytes:byte(i + k)
      if k == 1 and (b < low or b > high) then return false end
      if k > 1 and (b < 0x80 or b > 0xBF) then return false end
    end
    i = i + need + 1
  end
  return true
end

local function range(tvb, pos, size)
  return tvb:range(pos, size)
end

-- An ISO-8601 UTC rendering of a ns-since-epoch field, appended to its tree item.
local function append_time(item, tvb, pos)
  local ns = tvb:range(pos, 8):uint64()
  local billion = UInt64.new(1000000000)
  local secs = (ns / billion):tonumber()
  local frac = (ns % billion):tonumber()
  local ok, text = pcall(os.date, "!%Y-%m-%dT%H:%M:%S", secs)
  if ok and text then
    item:append_text(string.format(" (%s.%09dZ)", text, frac))
  end
end

local function add_ints(tree, tvb, prefix, fields, base_pos)
  local values = {}
  for _, f in ipairs(fields) do
    local r = range(tvb, base_pos + f.offset, f.width)
    local item = tree:add(F[prefix .. "." .. f.name], r)
    if f.width <= 4 then values[f.name] = r:uint() end
    if f.time then append_time(item, tvb, base_pos + f.offset) end
  end
  return values
end

-- The Info column: one frame's summary, or after the first of a TCP segment's, " | " and more.
local function show_info(pinfo, text)
  if tostring(pinfo.cols.info):find("^topicwire ") then
    pinfo.cols.info:append(" | " .. text)
  else
    pinfo.cols.info:set(text)
  end
end

local function flag(tree, pinfo, reason, offset)
  tree:add(F["topicwire.malformed"], reason)
  tree:add(F["topicwire.malformed_offset"], offset)
  tree:add_proto_expert_info(malformed_expert,
                             "malformed frame: " .. reason .. " at byte " .. offset)
  pinfo.cols.info:append(" [malformed: " .. reason .. "]")
  return false
end

local function walk_messages(tvb, pinfo, tree, body_end, count)
  if count == 0 or count > C.MAX_MESSAGES_PER_FRAME then
    return flag(tree, pinfo, "bad_count", C.MSG_COUNT_OFFSET)
  end
  local pos = C.FRAME_HEADER_BYTES
  for index = 0, count - 1 do
    if pos + C.MESSAGE_HEADER_BYTES > body_end then
      return flag(tree, pinfo, "message_overrun", pos)
    end
    local sub = tree:add(F["topicwire.message"], range(tvb, pos, C.MESSAGE_HEADER_BYTES))
    sub:set_text("message " .. index)
    local v = add_ints(sub, tvb, "topicwire.message", MESSAGE_FIELDS, pos)
    if v.qos > C.MAX_QOS then return flag(tree, pinfo, "bad_qos", pos + C.QOS_OFFSET) end
    if has_bits_outside(v.flags, C.KNOWN_MESSAGE_FLAGS) then
      return flag(tree, pinfo, "unknown_flags", pos + C.MSG_FLAGS_OFFSET)
    end
    local size = C.MESSAGE_HEADER_BYTES + align8(v.payload_len + v.topic_len)
    if pos + size > body_end then
      return flag(tree, pinfo, "message_overrun", pos + C.PAYLOAD_LEN_OFFSET)
    end
    sub:set_len(size)
    local at = pos + C.PAYLOAD_OFFSET
    sub:add(F["topicwire.message.payload"], range(tvb, at, v.payload_len))
    sub:add_packet_field(F["topicwire.message.topic"],
                         range(tvb, at + v.payload_len, v.topic_len), ENC_UTF_8)
    local name = topic_names[tostring(tvb:range(pos, 8):uint64())]
    if v.topic_len == 0 and name ~= nil then
      sub:add(F["topicwire.message.topic_name"], name):set_generated()
    end
    pos = pos + size
  end
  if pos ~= body_end then return flag(tree, pinfo, "trailing_bytes", pos) end
  return true
end

local function walk_admin(tvb, pinfo, tree, body_end, frame_type, count)
  local layout = ADMIN_LAYOUTS[frame_type]
  if count == 0 then return flag(tree, pinfo, "bad_count", C.MSG_COUNT_OFFSET) end
  local pos = C.FRAME_HEADER_BYTES
  if layout.body_bytes > 0 then
    if pos + layout.body_bytes > body_end then
      return flag(tree, pinfo, "message_overrun", pos)
    end
    add_ints(tree, tvb, "topicwire." .. layout.body_name, layout.body_fields, pos)
    pos = pos + layout.body_bytes
  end
  local prefix = "topicwire." .. layout.entry
  for index = 0, count - 1 do
    if pos + layout.fixed_bytes > body_end then
      return flag(tree, pinfo, "message_overrun", pos)
    end
    local sub = tree:add(F["topicwire.entry"], range(tvb, pos, layout.fixed_bytes))
    sub:set_text(layout.entry .. " " .. index)
    local v = add_ints(sub, tvb, prefix, layout.fields, pos)
    local text_pos = pos + layout.fixed_bytes
    for _, name in ipairs(layout.texts) do
      local size = v[name .. "_len"]
      if text_pos + size > body_end then
        return flag(tree, pinfo, "message_overrun", text_pos)
      end
      if size > layout.text_limit_bytes or not utf8_ok(tvb, text_pos, size) then
        return flag(tree, pinfo, "bad_field", text_pos)
      end
      sub:add_packet_field(F[prefix .. "." .. name], range(tvb, text_pos, size), ENC_UTF_8)
      text_pos = text_pos + size
    end
    for _, f in ipairs(layout.fields) do
      if f.enum and ENUMS[f.enum][v[f.name]] == nil then
        return flag(tree, pinfo, "bad_field", pos)
      end
    end
    local entry_end = pos + layout.fixed_bytes + align8(text_pos - pos - layout.fixed_bytes)
    if entry_end > body_end then return flag(tree, pinfo, "message_overrun", text_pos) end
    if layout.names_keys then  -- a REGISTRY_UPDATE entry: topic_key first, then its topic
      local at = pos + layout.fixed_bytes
      topic_names[tostring(tvb:range(pos, 8):uint64())] = tvb:range(at, v.topic_len):string(
        ENC_UTF_8)
    end
    sub:set_len(entry_end - pos)
    pos = entry_end
  end
  if pos ~= body_end then return flag(tree, pinfo, "trailing_bytes", pos) end
  return true
end

-- One frame in one datagram (the codec's decode_frame with exact=True).
local function dissect_frame(tvb, pinfo, root)
  local length = tvb:len()
  pinfo.cols.protocol = "topicwire"
  local tree = root:add(proto, tvb())
  if length < C.FRAME_HEADER_BYTES then
    show_info(pinfo, "topicwire")
    return flag(tree, pinfo, "too_short", 0)
  end
  local h = add_ints(tree, tvb, "topicwire", HEADER_FIELDS, 0)
  local type_name = ENUMS.frame_type[h.frame_type] or ("type " .. h.frame_type)
  show_info(pinfo, string.format("topicwire %s count=%d stream=%d", type_name, h.msg_count,
                                 h.stream_id))
  tree:append_text(", " .. type_name)
  if h.magic ~= C.FRAME_MAGIC then return flag(tree, pinfo, "bad_magic", C.MAGIC_OFFSET) end
  if h.version ~= C.PROTOCOL_VERSION then
    return flag(tree, pinfo, "bad_version", C.VERSION_OFFSET)
  end
  if h.frame_type < 1 or h.frame_type > C.MAX_FRAME_TYPE then
    return flag(tree, pinfo, "unknown_type", C.TYPE_OFFSET)
  end
  if has_bits_outside(h.flags, C.KNOWN_FRAME_FLAGS) then
    return flag(tree, pinfo, "unknown_flags", C.FLAGS_OFFSET)
  end
  local frame_len = h.frame_len
  if frame_len < C.FRAME_HEADER_BYTES or frame_len % C.FRAME_ALIGNMENT_BYTES ~= 0
      or frame_len > C.MAX_FRAME_BYTES or frame_len > length then
    return flag(tree, pinfo, "bad_frame_length", C.FRAME_LEN_OFFSET)
  end
  if frame_len ~= length then return flag(tree, pinfo, "length_mismatch", C.FRAME_LEN_OFFSET) end
  local authenticated = h.flags % (2 * C.AUTH_TRAILER_FLAG) >= C.AUTH_TRAILER_FLAG
  if authenticated and frame_len < C.FRAME_HEADER_BYTES + C.AUTH_TRAILER_BYTES then
    return flag(tree, pinfo, "bad_frame_length", C.FRAME_LEN_OFFSET)
  end
  local body_end = frame_len
  if authenticated then
    body_end = frame_len - C.AUTH_TRAILER_BYTES
    local sub = tree:add(F["topicwire.auth"], range(tvb, body_end, C.AUTH_TRAILER_BYTES))
    add_ints(sub, tvb, "topicwire.auth", AUTH_FIELDS, body_end)
    sub:add(F["topicwire.auth.mac"],
            range(tvb, frame_len - C.AUTH_MAC_BYTES, C.AUTH_MAC_BYTES))
  end
  if MESSAGE_FRAME_TYPES[h.frame_type] then
    return walk_messages(tvb, pinfo, tree, body_end, h.msg_count)
  end
  return walk_admin(tvb, pinfo, tree, body_end, h.frame_type, h.msg_count)
end

function proto.dissector(tvb, pinfo, root)
  dissect_frame(tvb, pinfo, root)
  return tvb:len()
end

-- Any UDP port: a datagram that starts with the magic is a native frame (clients, fabric
-- and group ports differ per config); the default port is claimed whatever it holds.
local function heuristic(tvb, pinfo, root)
  if tvb:len() < 2 or tvb:range(0, 2):uint() ~= C.FRAME_MAGIC then return false end
  dissect_frame(tvb, pinfo, root)
  return true
end

DissectorTable.get("udp.port"):add(C.NATIVE_UDP_PORT, proto)
proto:register_heuristic("udp", heuristic)

-- TCP (channels/tcp.py): frames back to back, delimited by frame_len. A header that is not
-- a frame's, or an impossible frame_len, takes the rest of the segment and is flagged: the
-- channel closes such a connection, since a stream cannot be resynchronised.
local tcp_proto = Proto("topicwire_tcp", "topicwire native protocol v1 over TCP")

local function tcp_frame_len(tvb, _pinfo, offset)
  local frame_len = tvb:range(offset + C.FRAME_LEN_OFFSET, 4):uint()
  if tvb:range(offset, 2):uint() ~= C.FRAME_MAGIC or frame_len < C.FRAME_HEADER_BYTES
      or frame_len % C.FRAME_ALIGNMENT_BYTES ~= 0 or frame_len > C.MAX_FRAME_BYTES then
    return tvb:len() - offset
  end
  return frame_len
end

-- Frames cut out of a segment; a frame that goes on in the next segment asks TCP for it
-- (pinfo.desegment_*: dissect_tcp_pdus cannot from a heuristic dissector in Wireshark 4.0).
function tcp_proto.dissector(tvb, pinfo, root)
  local offset, length = 0, tvb:len()
  while offset < length do
    if length - offset < C.FRAME_LEN_OFFSET + 4 then
      pinfo.desegment_offset = offset
      pinfo.desegment_len = DESEGMENT_ONE_MORE_SEGMENT
      return length
    end
    local size = tcp_frame_len(tvb, pinfo, offset)
    if offset + size > length then
      pinfo.desegment_offset = offset
      pinfo.desegment_len = offset + size - length
      return length
    end
    dissect_frame(tvb:range(offset, size):tvb(), pinfo, root)
    offset = offset + size
  end
  return offset
end

local function tcp_heuristic(tvb, pinfo, root)
  if tvb:len() < 2 or tvb:range(0, 2):uint() ~= C.FRAME_MAGIC then return false end
  pinfo.conversation = tcp_proto  -- the rest of this connection, segment boundaries or not
  tcp_proto.dissector(tvb, pinfo, root)
  return true
end

tcp_proto:register_heuristic("tcp", tcp_heuristic)
DissectorTable.get("tcp.port"):add_for_decode_as(tcp_proto)  -- Decode As: a known port
